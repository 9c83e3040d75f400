//! Selects broken protocol variants (mutants, `scripts/mutants.sh`) from
//! the `SWARM_MUTANT` environment variable, for this crate alone:
//! `SWARM_MUTANT=NAME` compiles mutant NAME in (`--cfg
//! swarm_mutant="NAME"`), `SWARM_MUTANT=switch` builds every mutant behind
//! a switch read when the process runs (`--cfg swarm_mutant_switch`; see
//! `src/substrate/mutant.rs`). Passing the cfg through `RUSTFLAGS` instead
//! would rebuild every dependency for each mutant.

fn main() {
    println!("cargo::rerun-if-env-changed=SWARM_MUTANT");
    if let Ok(name) = std::env::var("SWARM_MUTANT")
        && !name.is_empty()
    {
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            panic!("SWARM_MUTANT={name:?}: a mutant's name is letters, digits and dashes");
        }
        if name == "switch" {
            println!("cargo::rustc-cfg=swarm_mutant_switch");
        } else {
            println!("cargo::rustc-cfg=swarm_mutant=\"{name}\"");
        }
    }
}
