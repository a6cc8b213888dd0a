//! Short fuzz runs of every parser of outside input, in the ordinary test suite.
//!
//! The checks are the fuzz targets' own (`fuzz/src/lib.rs`, included here as a module):
//! each parser gets arbitrary bytes and near-valid inputs (valid ones with bytes flipped,
//! cut short, repeated, or a number swapped for a huge, negative, fractional or non-number
//! one) and must answer with its typed error or a value it would accept again, never a
//! panic. Long runs: `cargo +nightly fuzz run TARGET` (docs/testing.md, "Fuzzing").

// Relative to tests/cli/: this file is a module loaded by #[path] (tests/cli.rs).
#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Cases per strategy and target: arbitrary bytes, then mutated seeds.
const CASES: u32 = 256;

/// What replaces a number in a seed.
const NUMBERS: &[&str] = &[
    "-1", "0", "-0", "1e309", "-1e309", "NaN", "nan", "inf", "1e-320", "18446744073709551615", "18446744073709551616",
    "99999999999999999999999999", "4294967296", "-9223372036854775809", "0.0000001", "1.5", "\"1\"", "null", "[]", "{}",
];

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, bits: u8 },
    Set { at: usize, byte: u8 },
    Truncate { at: usize },
    Insert { at: usize, bytes: Vec<u8> },
    /// Repeat a slice (a duplicated key, record or line).
    Repeat { at: usize, len: usize },
    /// Replace the `nth` number of the input.
    Number { nth: usize, with: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1..64usize).prop_map(|(at, len)| Mutation::Repeat { at, len }),
        (any::<usize>(), any::<usize>()).prop_map(|(nth, with)| Mutation::Number { nth, with }),
        (any::<usize>(), any::<usize>()).prop_map(|(nth, with)| Mutation::Number { nth, with }),
    ]
}

/// Where the numbers of `bytes` are: runs of digits, with a leading `-` and a fraction.
fn numbers(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = if i > 0 && bytes[i - 1] == b'-' { i - 1 } else { i };
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            out.push((start, i));
        } else {
            i += 1;
        }
    }
    out
}

fn mutate(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for m in mutations {
        let len = bytes.len();
        match m {
            Mutation::Flip { at, bits } if len > 0 => bytes[at % len] ^= bits,
            Mutation::Set { at, byte } if len > 0 => bytes[at % len] = *byte,
            Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
            Mutation::Insert { at, bytes: new } => {
                let at = at % (len + 1);
                bytes.splice(at..at, new.iter().copied());
            }
            Mutation::Repeat { at, len: n } if len > 0 => {
                let at = at % len;
                let part: Vec<u8> = bytes[at..(at + n).min(len)].to_vec();
                bytes.splice(at..at, part);
            }
            Mutation::Number { nth, with } => {
                let found = numbers(&bytes);
                if !found.is_empty() {
                    let (start, end) = found[nth % found.len()];
                    bytes.splice(start..end, NUMBERS[with % NUMBERS.len()].bytes());
                }
            }
            _ => {}
        }
    }
    bytes
}

fn runner() -> TestRunner {
    TestRunner::new(Config { cases: CASES, failure_persistence: None, ..Config::default() })
}

/// `check` on arbitrary bytes, then on mutated seeds of `target`.
fn fuzz(target: &str) {
    let check = harness::TARGETS.iter().find(|(name, _)| *name == target).expect("a known target").1;
    let seeds = harness::seeds(target);
    runner()
        .run(&proptest::collection::vec(any::<u8>(), 0..512), |data| {
            check(&data);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{target}, arbitrary bytes: {e}"));
    let strategy = (0..seeds.len(), proptest::collection::vec(mutation(), 1..5));
    runner()
        .run(&strategy, |(seed, mutations)| {
            check(&mutate(&seeds[seed], &mutations));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{target}, mutated seeds: {e}"));
}

macro_rules! fuzz_tests {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                fuzz(stringify!($target));
            }
        )*

        #[test]
        fn every_target_is_run_here() {
            let here = [$(stringify!($target)),*];
            let targets: Vec<&str> = harness::TARGETS.iter().map(|(name, _)| *name).collect();
            assert_eq!(targets, here);
            for name in here {
                let file = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("fuzz/fuzz_targets").join(format!("{name}.rs"));
                assert!(file.is_file(), "{} is missing", file.display());
            }
        }
    };
}

fuzz_tests!(
    config,
    size,
    workload_record,
    partitions,
    intent_record,
    pool_state,
    carbon_state,
    intensity_response,
    file_source,
    usage_file,
    proc_file,
    board_file,
    vgpu_dir,
);

// ---- valid inputs still parse ----

#[test]
fn every_seed_is_accepted() {
    use vgpu_carbon::intensity;
    use vgpu_carbon::intensity::command;
    use vgpu_carbon::intensity::electricitymaps;
    use vgpu_carbon::intensity::file;
    use vgpu_carbon::intensity::uk_grid;
    for (target, check) in harness::TARGETS {
        for seed in harness::seeds(target) {
            check(&seed); // no panic on what vgpu itself writes
        }
    }
    for seed in harness::seeds("config") {
        let config = vgpu_host::config::Config::parse(std::str::from_utf8(&seed).unwrap()).unwrap();
        config.carbon.validate().unwrap();
    }
    let w = vgpu_store::state::Workload::parse(harness::WORKLOAD_SEED.as_bytes(), Path::new("a1b2c3d4.json")).unwrap();
    assert_eq!((w.id.as_str(), w.partition.as_deref(), w.gpus[0].mem_bytes), ("a1b2c3d4", Some("svc"), 4 << 30));
    for seed in harness::seeds("partitions") {
        vgpu_store::state::Partitions::parse(&seed, Path::new("p.json")).unwrap();
    }
    for seed in harness::seeds("intent_record") {
        let dir = tempfile::tempdir().unwrap();
        let store = vgpu_store::state::Store::new(&dir.path().join("state"), &dir.path().join("lib"));
        std::fs::create_dir_all(store.intents_dir()).unwrap();
        std::fs::write(store.intents_dir().join("pool-1-1.json"), &seed).unwrap();
        let (good, bad) = vgpu_store::state::intent::list(&store);
        assert_eq!((good.len(), bad.len()), (1, 0), "{bad:?}");
    }
    let pool: vgpu_pool::Pool = serde_json::from_slice(&harness::seeds("pool_state")[0]).unwrap();
    assert_eq!((pool.allocations().count(), pool.total_blocks()), (4, 12));
    let responses = harness::seeds("intensity_response");
    let body = |i: usize| std::str::from_utf8(&responses[i][1..]).unwrap().to_string();
    assert_eq!(electricitymaps::parse_body(&body(0), "DE").unwrap().g_per_kwh, 302.0);
    assert_eq!(uk_grid::parse_body(&body(1), &uk_grid::Area::National).unwrap().g_per_kwh, 263.0);
    assert_eq!(uk_grid::parse_body(&body(2), &uk_grid::Area::Postcode("RG10".into())).unwrap().g_per_kwh, 266.0);
    assert_eq!(uk_grid::parse_body(&body(3), &uk_grid::Area::Region(13)).unwrap().g_per_kwh, 100.0);
    assert_eq!(command::parse_output(&body(4)).unwrap(), 300.5);
    assert_eq!(intensity::error_detail(&body(5)), "400 Bad Request: Please enter a valid postcode.");
    for seed in harness::seeds("file_source") {
        let series = file::parse_series(std::str::from_utf8(&seed).unwrap()).unwrap();
        assert!(file::at(&series, harness::now()).is_some());
    }
    use harness::SharedFile::*;
    for which in [Usage, Limits, Slot, OtherSlot, OtherLimits] {
        harness::open_shared(which, &harness::valid_shared_file(which)).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("4000000000-1");
    std::fs::write(&path, &harness::seeds("proc_file")[0]).unwrap();
    assert_eq!(vgpu_abi::procfile::ProcFile::open(&path).unwrap().used(), [0, 1 << 30]);
}

// ---- garbage is refused with the right error ----

proptest! {
    #![proptest_config(Config { cases: CASES, failure_persistence: None, ..Config::default() })]

    /// A usage, limits, per-process or board slot file whose magic is damaged is refused as such.
    #[test]
    fn a_damaged_magic_is_refused(which in 0..4usize, at in 0..8usize, bits in 1..=255u8) {
        use vgpu_abi::usage::LayoutError;
        let (bytes, err) = damaged(which, |bytes| bytes[at] ^= bits);
        prop_assert!(matches!(err, Some(LayoutError::BadMagic { .. })), "{which}, {} bytes: {err:?}", bytes.len());
    }

    /// Cut short or grown, they are refused as truncated.
    #[test]
    fn a_wrong_length_is_refused(which in 0..4usize, cut in any::<usize>(), grow in any::<bool>()) {
        use vgpu_abi::usage::LayoutError;
        let (bytes, err) = damaged(which, |bytes| {
            if grow {
                bytes.extend(std::iter::repeat_n(0, 1 + cut % 4096));
            } else {
                bytes.truncate(cut % bytes.len());
            }
        });
        prop_assert!(matches!(err, Some(LayoutError::Truncated { .. })), "{which}, {} bytes: {err:?}", bytes.len());
    }

    /// A record with a number out of its field's range is damaged, not misread.
    #[test]
    fn out_of_range_numbers_in_a_record_are_refused(nth in any::<usize>(), with in prop::sample::select(vec![
        "1e309", "NaN", "18446744073709551616", "1.5", "\"1\"", "null",
    ])) {
        let seed = harness::WORKLOAD_SEED.as_bytes();
        // The record's integers (not digits inside strings, not freq_sensitivity, a float
        // that may also be null).
        let found: Vec<(usize, usize)> = numbers(seed)
            .into_iter()
            .filter(|&(start, end)| seed[..start].iter().filter(|&&b| b == b'"').count() % 2 == 0 && !seed[start..end].contains(&b'.'))
            .collect();
        let (start, end) = found[nth % found.len()];
        let original = std::str::from_utf8(&seed[start..end]).unwrap();
        // Optional integers may be null.
        prop_assume!(!(with == "null" && ["4", "1240"].contains(&original)));
        let mut bytes = seed.to_vec();
        bytes.splice(start..end, with.bytes());
        let path = Path::new("w.json");
        match vgpu_store::state::Workload::parse(&bytes, path) {
            Err(vgpu_store::state::StateError::Damaged { path: named, .. }) => prop_assert_eq!(named, path),
            other => prop_assert!(false, "{original} → {with}: {other:?}"),
        }
    }

    /// A size is refused with the input named, or read as what it says.
    #[test]
    fn sizes_read_as_written(n in 1u64..1 << 30, unit in 0..5usize) {
        let (suffix, shift) = [("", 0), ("K", 10), ("M", 20), ("G", 30), ("GiB", 30)][unit];
        prop_assert_eq!(vgpu_abi::size::parse_size(&format!("{n}{suffix}")), Ok(n << shift));
        let negative = format!("-{n}{suffix}");
        prop_assert_eq!(vgpu_abi::size::parse_size(&negative).unwrap_err().input, negative);
    }
}

/// A valid usage (0), limits (1), per-process (2) or own board slot (3) file changed by
/// `edit`, and what opening it gave.
fn damaged(which: usize, edit: impl FnOnce(&mut Vec<u8>)) -> (Vec<u8>, Option<vgpu_abi::usage::LayoutError>) {
    use harness::SharedFile::*;
    let shared = [Some(Usage), Some(Limits), None, Some(Slot)][which];
    let mut bytes = match shared {
        Some(file) => harness::valid_shared_file(file),
        None => harness::seeds("proc_file")[0].clone(),
    };
    edit(&mut bytes);
    let err = match shared {
        Some(file) => harness::open_shared(file, &bytes).err(),
        None => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("1-1");
            std::fs::write(&path, &bytes).unwrap();
            vgpu_abi::procfile::ProcFile::open(&path).err()
        }
    };
    (bytes, err)
}

/// The seeds as files, one directory per target: where `cargo fuzz run` starts from. Into a
/// temporary directory (checking every target has seeds), or, with
/// `VGPU_FUZZ_SEEDS=1 cargo test --test integration cli::fuzz_parsers::seed_corpora`, into `fuzz/corpus/`.
#[test]
fn seed_corpora() {
    let scratch = tempfile::tempdir().unwrap();
    let root = match std::env::var_os("VGPU_FUZZ_SEEDS") {
        Some(_) => Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("fuzz/corpus"),
        None => scratch.path().to_path_buf(),
    };
    for (target, _) in harness::TARGETS {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        let seeds = harness::seeds(target);
        assert!(!seeds.is_empty(), "target {target} has no seed");
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed).unwrap();
        }
        assert!(std::fs::read_dir(&dir).unwrap().count() >= seeds.len(), "{target}");
    }
}
