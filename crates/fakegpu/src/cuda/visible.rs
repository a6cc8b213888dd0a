//! `CUDA_VISIBLE_DEVICES`, read the way the real driver reads it.
//!
//! A comma-separated list of device indices or UUIDs (`GPU-…`, any unique prefix, any
//! case). Devices appear in the order listed. Parsing stops at the first entry that is not
//! a valid, not yet listed device: `0,2,-1,1` makes devices 0 and 2 visible. An empty value
//! hides every device; unset shows all. MIG identifiers are not simulated and stop parsing.

/// CUDA ordinal → index into `uuids`.
pub(crate) fn parse(spec: Option<&str>, uuids: &[&str]) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..uuids.len()).collect();
    };
    let mut visible = Vec::new();
    for entry in spec.split(',') {
        match lookup(entry.trim(), uuids) {
            Some(index) if !visible.contains(&index) => visible.push(index),
            _ => break,
        }
    }
    visible
}

fn lookup(entry: &str, uuids: &[&str]) -> Option<usize> {
    if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
        let prefix = entry.to_ascii_lowercase();
        let mut matches = uuids
            .iter()
            .enumerate()
            .filter(|(_, u)| u.to_ascii_lowercase().starts_with(&prefix));
        let (index, _) = matches.next()?;
        return matches.next().is_none().then_some(index);
    }
    if entry.is_empty() || !entry.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    entry.parse::<usize>().ok().filter(|&i| i < uuids.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUIDS: [&str; 3] = [
        "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
        "GPU-8932aaaa-0000-0000-0000-000000000000",
        "GPU-11111111-2222-3333-4444-555555555555",
    ];

    #[test]
    fn unset_and_empty() {
        assert_eq!(parse(None, &UUIDS), vec![0, 1, 2]);
        assert_eq!(parse(Some(""), &UUIDS), Vec::<usize>::new());
    }

    #[test]
    fn indices_in_order_until_the_first_invalid() {
        assert_eq!(parse(Some("2,0"), &UUIDS), vec![2, 0]);
        assert_eq!(parse(Some("0,2,-1,1"), &UUIDS), vec![0, 2]);
        assert_eq!(parse(Some("0, 1"), &UUIDS), vec![0, 1]);
        assert_eq!(parse(Some("3,0"), &UUIDS), Vec::<usize>::new());
        assert_eq!(parse(Some("0,0,1"), &UUIDS), vec![0]);
        assert_eq!(parse(Some("0,,1"), &UUIDS), vec![0]);
        assert_eq!(parse(Some("+1"), &UUIDS), Vec::<usize>::new());
    }

    #[test]
    fn uuids_and_unique_prefixes() {
        assert_eq!(parse(Some(UUIDS[2]), &UUIDS), vec![2]);
        assert_eq!(parse(Some("GPU-1111,gpu-8932F937"), &UUIDS), vec![2, 0]);
        assert_eq!(
            parse(Some("GPU-8932,0"), &UUIDS),
            Vec::<usize>::new(),
            "ambiguous prefix"
        );
        assert_eq!(parse(Some("1,MIG-1234"), &UUIDS), vec![1]);
    }
}
