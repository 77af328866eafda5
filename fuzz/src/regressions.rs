//! `regressions/<target>/`: every directory names a fuzz target and every
//! file in it is a reproducer named after its bug (not libFuzzer's
//! `crash-<sha1>`), as `scripts/fuzz-campaign.sh` asks when it copies a
//! finding there. `scripts/fuzz.sh` replays them all before fuzzing.

use std::path::PathBuf;

#[test]
fn regressions_are_named_and_have_a_target() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let Ok(dirs) = std::fs::read_dir(root.join("regressions")) else {
        return;
    };
    for d in dirs {
        let d = d.unwrap();
        let target = d.file_name().into_string().unwrap();
        assert!(
            manifest.contains(&format!("name = \"{target}\"")),
            "regressions/{target}: no fuzz target of that name"
        );
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let name = f.file_name().into_string().unwrap();
            let raw = ["crash-", "timeout-", "oom-", "leak-", "slow-unit-"];
            assert!(
                !raw.iter().any(|p| name.starts_with(p)),
                "regressions/{target}/{name}: rename it after the bug it reproduces"
            );
            assert!(
                f.metadata().unwrap().len() > 0 || name.contains("empty"),
                "regressions/{target}/{name} is empty"
            );
        }
    }
}
