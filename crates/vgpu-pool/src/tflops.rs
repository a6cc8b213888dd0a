//! Peak dense tensor TFLOPS by GPU model: how many pool blocks a GPU is worth.
//!
//! Precision: **BF16 on the tensor cores with FP32 accumulate, dense (no 2:4 sparsity)**.
//! Volta and Turing have no BF16; for them the figure is FP16 tensor with FP32 accumulate
//! (NVIDIA's "mixed precision" or "deep learning" figure). Datasheets print the sparse
//! figure for Ampere and later (marked `*`); the dense figure is half of it, and that half is
//! what the table holds. These are peaks at boost clock, not sustained rates: they rank
//! devices, they do not predict a job's speed. Where a figure does not suit a host (a
//! power-capped card, a different precision), override it in the config (`[pool.tflops]`
//! by model, `[pool.uuid_tflops]` by GPU).
//!
//! Lookup: the exact name NVML reports, then case- and spacing-insensitive, then by the
//! model's distinguishing words ("a100" + "pcie", …). An unknown model is `None`: the
//! caller asks the user for a config override rather than guessing.

/// One model: the names NVML reports for it, the words that identify it in an unlisted
/// variant's name, its peak dense BF16 (or FP16) tensor TFLOPS, and where the figure is from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelTflops {
    pub names: &'static [&'static str],
    pub words: &'static [&'static str],
    pub tflops: f64,
    pub source: &'static str,
}

/// What the figures measure, for listings and the user guide.
pub const PRECISION: &str =
    "peak dense BF16 tensor TFLOPS with FP32 accumulate, no sparsity (FP16 for Volta and Turing)";

const fn model(
    names: &'static [&'static str],
    words: &'static [&'static str],
    tflops: f64,
    source: &'static str,
) -> ModelTflops {
    ModelTflops { names, words, tflops, source }
}

pub static TABLE: &[ModelTflops] = &[
    // Blackwell. HGX B200 specifications: FP16/BF16 tensor 36 PFLOPS* for 8 GPUs (sparse)
    // = 4.5 PFLOPS* per GPU, 2.25 PFLOPS dense.
    model(&["NVIDIA B200"], &["b200"], 2250.0, "NVIDIA HGX B200 specifications: 36 PFLOPS* BF16 per 8 GPUs"),
    // Hopper. H200 datasheet: SXM BF16 1,979 TFLOPS*, NVL 1,671 TFLOPS*.
    model(
        &["NVIDIA H200", "NVIDIA H200 SXM 141GB"],
        &["h200"],
        989.5,
        "NVIDIA H200 Tensor Core GPU datasheet: BF16 1,979 TFLOPS*",
    ),
    model(
        &["NVIDIA H200 NVL"],
        &["h200", "nvl"],
        835.5,
        "NVIDIA H200 Tensor Core GPU datasheet: H200 NVL BF16 1,671 TFLOPS*",
    ),
    // H100 datasheet: SXM BF16 1,979 TFLOPS*, PCIe 1,513 TFLOPS*, NVL 1,671 TFLOPS*.
    model(
        &["NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB", "NVIDIA H100 SXM5 64GB", "NVIDIA H100 SXM5 94GB"],
        &["h100", "sxm5"],
        989.5,
        "NVIDIA H100 Tensor Core GPU datasheet: H100 SXM BF16 1,979 TFLOPS*",
    ),
    model(
        &["NVIDIA H100 PCIe"],
        &["h100", "pcie"],
        756.5,
        "NVIDIA H100 Tensor Core GPU datasheet: H100 PCIe BF16 1,513 TFLOPS*",
    ),
    model(
        &["NVIDIA H100 NVL"],
        &["h100", "nvl"],
        835.5,
        "NVIDIA H100 Tensor Core GPU datasheet: H100 NVL BF16 1,671 TFLOPS*",
    ),
    // Ampere data center. A100 datasheet: BF16 312 TFLOPS | 624 TFLOPS* for all four boards.
    model(
        &["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"],
        &["a100"],
        312.0,
        "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS",
    ),
    model(&["NVIDIA A30"], &["a30"], 165.0, "NVIDIA A30 Tensor Core GPU datasheet: BF16 165 TFLOPS"),
    model(&["NVIDIA A40"], &["a40"], 149.7, "NVIDIA A40 datasheet: BF16 Tensor Core 149.7 TFLOPS"),
    model(&["NVIDIA A10"], &["a10"], 125.0, "NVIDIA A10 Tensor Core GPU datasheet: BF16 Tensor Core 125 TFLOPS"),
    model(&["NVIDIA A2"], &["a2"], 18.0, "NVIDIA A2 Tensor Core GPU datasheet: BF16 Tensor Core 18 TFLOPS"),
    // Ada data center. L40S/L40 datasheets: BF16 362.05 | 733* and 181.05 | 362.1*;
    // L4 datasheet: BF16 242 TFLOPS*.
    model(&["NVIDIA L40S"], &["l40s"], 362.05, "NVIDIA L40S datasheet: BF16 Tensor Core 362.05 TFLOPS"),
    model(&["NVIDIA L40"], &["l40"], 181.05, "NVIDIA L40 datasheet: BF16 Tensor Core 181.05 TFLOPS"),
    model(&["NVIDIA L4"], &["l4"], 121.0, "NVIDIA L4 Tensor Core GPU datasheet: BF16 242 TFLOPS*"),
    // Turing. T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS; no sparsity.
    model(&["Tesla T4"], &["t4"], 65.0, "NVIDIA T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS"),
    // Volta. V100 datasheet: tensor performance (deep learning) 125 (SXM2), 112 (PCIe);
    // V100S datasheet: 130.
    model(
        &["Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB-LS"],
        &["v100", "sxm2"],
        125.0,
        "NVIDIA Tesla V100 datasheet: SXM2 tensor performance 125 TFLOPS",
    ),
    model(
        &["Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"],
        &["v100", "pcie"],
        112.0,
        "NVIDIA Tesla V100 datasheet: PCIe tensor performance 112 TFLOPS",
    ),
    model(&["Tesla V100S-PCIE-32GB"], &["v100s"], 130.0, "NVIDIA V100S datasheet: tensor performance 130 TFLOPS"),
    // Workstation and GeForce: the architecture whitepapers' "peak BF16 tensor TFLOPS with
    // FP32 accumulate" (GeForce runs FP32-accumulate at half the FP16-accumulate rate).
    model(
        &["NVIDIA RTX A6000"],
        &["rtx", "a6000"],
        154.8,
        "NVIDIA RTX A6000 datasheet: tensor performance 309.7 TFLOPS*",
    ),
    model(
        &["NVIDIA GeForce RTX 4090"],
        &["rtx", "4090"],
        165.2,
        "NVIDIA Ada GPU architecture whitepaper: RTX 4090 peak BF16 tensor (FP32 accumulate) 165.2 TFLOPS",
    ),
    model(
        &["NVIDIA GeForce RTX 3090"],
        &["rtx", "3090"],
        71.0,
        "NVIDIA Ampere GA102 GPU architecture whitepaper: RTX 3090 peak BF16 tensor (FP32 accumulate) 71 TFLOPS",
    ),
];

/// The table entry for a GPU model name as NVML reports it.
pub fn lookup(name: &str) -> Option<&'static ModelTflops> {
    if let Some(m) = TABLE.iter().find(|m| m.names.contains(&name)) {
        return Some(m);
    }
    let wanted = normalise(name);
    if let Some(m) = TABLE.iter().find(|m| m.names.iter().any(|n| normalise(n) == wanted)) {
        return Some(m);
    }
    // An unlisted variant ("NVIDIA A100-SXM4-64GB"): the entry whose words all appear in
    // the name as whole words; the most specific (most words) wins, and a tie means the
    // name is ambiguous.
    let words = words(name);
    let mut best: Option<&ModelTflops> = None;
    let mut tied = false;
    for m in TABLE.iter().filter(|m| m.words.iter().all(|w| words.iter().any(|x| x == w))) {
        match best {
            Some(b) if b.words.len() > m.words.len() => {}
            Some(b) if b.words.len() == m.words.len() => tied = true,
            _ => {
                best = Some(m);
                tied = false;
            }
        }
    }
    if tied {
        None
    } else {
        best
    }
}

/// Peak dense TFLOPS of a GPU model, if the table knows it.
pub fn peak_tflops(name: &str) -> Option<f64> {
    lookup(name).map(|m| m.tflops)
}

/// Lower case, runs of spaces, dashes and underscores made one space.
fn normalise(name: &str) -> String {
    words(name).join(" ")
}

/// The lower-case alphanumeric words of a name ("NVIDIA A100-SXM4-40GB" → nvidia a100 sxm4 40gb).
fn words(name: &str) -> Vec<String> {
    name.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).map(|w| w.to_ascii_lowercase()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_names_resolve() {
        for (name, tflops) in [
            ("NVIDIA H100 80GB HBM3", 989.5),
            ("NVIDIA H100 PCIe", 756.5),
            ("NVIDIA H100 NVL", 835.5),
            ("NVIDIA H200", 989.5),
            ("NVIDIA A100-SXM4-40GB", 312.0),
            ("NVIDIA A100-SXM4-80GB", 312.0),
            ("NVIDIA A100-PCIE-40GB", 312.0),
            ("NVIDIA A100 80GB PCIe", 312.0),
            ("NVIDIA L40S", 362.05),
            ("NVIDIA L4", 121.0),
            ("NVIDIA A10", 125.0),
            ("Tesla T4", 65.0),
            ("Tesla V100-SXM2-16GB", 125.0),
            ("Tesla V100-PCIE-32GB", 112.0),
            ("NVIDIA GeForce RTX 4090", 165.2),
        ] {
            assert_eq!(peak_tflops(name), Some(tflops), "{name}");
        }
    }

    #[test]
    fn normalised_and_variant_names_resolve() {
        assert_eq!(peak_tflops("nvidia  h100 pcie"), Some(756.5));
        assert_eq!(peak_tflops("NVIDIA A100-SXM4-64GB"), Some(312.0));
        assert_eq!(peak_tflops("Tesla V100-SXM2-32GB"), Some(125.0));
        assert_eq!(peak_tflops("Tesla V100S-PCIE-32GB"), Some(130.0));
        // Whole words only: an A10G is not an A10, an L40S is not an L4 or an L40.
        assert_eq!(peak_tflops("NVIDIA A10G"), None);
        assert_eq!(peak_tflops("NVIDIA L40S"), Some(362.05));
        assert_eq!(peak_tflops("NVIDIA H200 NVL"), Some(835.5));
    }

    #[test]
    fn unknown_models_are_none() {
        assert_eq!(peak_tflops("NVIDIA Imaginary 9000"), None);
        assert_eq!(peak_tflops(""), None);
        // Only "h100" with no form factor: ambiguous between SXM, PCIe and NVL.
        assert_eq!(peak_tflops("NVIDIA H100"), None);
    }

    #[test]
    fn every_entry_is_sane() {
        for m in TABLE {
            assert!(m.tflops.is_finite() && m.tflops > 0.0, "{m:?}");
            assert!(!m.names.is_empty() && !m.words.is_empty() && !m.source.is_empty(), "{m:?}");
            for name in m.names {
                assert_eq!(lookup(name).map(|x| x.tflops), Some(m.tflops), "{name}");
            }
        }
    }
}
