//! Broken protocol variants ("mutants") kept in the code, so that CI can
//! prove that each check catches the bug it was written against
//! (`scripts/mutants.sh`).
//!
//! `mutant!("name")` is `false` in every normal build, and folds away. A
//! build selects mutants through swarm-core's build script:
//!
//! - `SWARM_MUTANT=name` at build time: that mutant, compiled in (what
//!   the loom checks use, whose builds have no standard library);
//! - `SWARM_MUTANT=switch` at build time: every mutant, each switched on
//!   when the process runs with `SWARM_MUTANT_ACTIVE=name` (with the `std`
//!   feature). One build then serves every mutant: a build of swarm-core
//!   takes minutes on CI's two cores, a mutant's failing test seconds.

/// Whether the broken variant `$name` runs (see the module's documentation).
macro_rules! mutant {
    ($name:tt) => {
        $crate::substrate::mutant::on($name, cfg!(swarm_mutant = $name))
    };
}
pub(crate) use mutant;

/// Whether mutant `name` runs: compiled in, or switched on at run time.
#[inline(always)]
pub fn on(name: &str, compiled: bool) -> bool {
    compiled || switched(name)
}

#[cfg(all(swarm_mutant_switch, feature = "std"))]
fn switched(name: &str) -> bool {
    static ACTIVE: std::sync::OnceLock<Option<std::string::String>> = std::sync::OnceLock::new();
    ACTIVE.get_or_init(|| std::env::var("SWARM_MUTANT_ACTIVE").ok()).as_deref() == Some(name)
}

#[cfg(not(all(swarm_mutant_switch, feature = "std")))]
#[inline(always)]
fn switched(_: &str) -> bool {
    false
}
