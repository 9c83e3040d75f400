//! Random choices as YCSB makes them: a seeded generator per client handle,
//! YCSB's Zipfian generator (Gray et al., "Quickly generating
//! billion-record synthetic databases", as `ZipfianGenerator.java`), its
//! scrambled variant (`ScrambledZipfianGenerator.java`, what YCSB's
//! `requestdistribution=zipfian` uses), the skewed-latest chooser of
//! workload D (`SkewedLatestGenerator.java`), uniform keys, and YCSB's key
//! names (`CoreWorkload.buildKeyName`).
//!
//! The formulas, constants and the FNV hash are YCSB's, so that a key
//! popularity profile here is the one the papers measured with.

use swarm_core::sim::Rng;

/// YCSB's Zipfian constant (theta).
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// The item count YCSB's scrambled Zipfian draws from before hashing.
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// `zeta(SCRAMBLED_ITEM_COUNT, 0.99)`, precomputed by YCSB.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// YCSB's 64-bit FNV-1a over the eight bytes of `val`, least significant
/// first, made non-negative as Java's `Math.abs` would (the one value whose
/// absolute value overflows keeps its magnitude here).
pub fn fnv64(val: u64) -> u64 {
    const OFFSET_BASIS: u64 = 0xCBF2_9CE4_8422_2325;
    const PRIME: u64 = 1_099_511_628_211;
    let mut hash = OFFSET_BASIS;
    let mut v = val;
    for _ in 0..8 {
        hash ^= v & 0xff;
        hash = hash.wrapping_mul(PRIME);
        v >>= 8;
    }
    (hash as i64).unsigned_abs()
}

/// A deterministic generator: one per client handle, seeded from the run's
/// seed and the handle's global index, so that a run's choices replay.
#[derive(Clone, Debug)]
pub struct Gen(Rng);

impl Gen {
    /// The generator of handle `index` in a run seeded with `seed`.
    pub fn new(seed: u64, index: u64) -> Gen {
        Gen(Rng::new(seed ^ (index.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// A uniform 64-bit word.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in `[0, n)` (`n > 0`), without modulo bias worth
    /// mentioning (128-bit multiply).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// `sum_{i=1..=n} 1 / i^theta`, continued from `sum` over the first `from`
/// terms (YCSB's incremental `zeta`).
pub fn zeta(from: u64, n: u64, theta: f64, sum: f64) -> f64 {
    let mut s = sum;
    for i in from..n {
        s += 1.0 / ((i + 1) as f64).powf(theta);
    }
    s
}

/// YCSB's `ZipfianGenerator`: integers in `[0, items)`, 0 the most popular,
/// item `i` drawn with probability proportional to `1 / (i+1)^theta`.
/// The item count may grow ([`Zipfian::next_of`]); zeta is then extended
/// incrementally, as YCSB does.
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// Over `items` items (at least 1), with [`ZIPFIAN_CONSTANT`].
    pub fn new(items: u64) -> Zipfian {
        let items = items.max(1);
        Zipfian::with_zetan(items, ZIPFIAN_CONSTANT, zeta(0, items, ZIPFIAN_CONSTANT, 0.0))
    }

    /// Over `items` items with a precomputed `zetan` (as YCSB's scrambled
    /// generator does for its ten billion items).
    pub fn with_zetan(items: u64, theta: f64, zetan: f64) -> Zipfian {
        let items = items.max(1);
        let zeta2 = zeta(0, 2, theta, 0.0);
        let mut z = Zipfian { items, theta, alpha: 1.0 / (1.0 - theta), zeta2, zetan, eta: 0.0 };
        z.eta = z.eta_for(items);
        z
    }

    fn eta_for(&self, items: u64) -> f64 {
        (1.0 - (2.0 / items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// The item count.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// The next item in `[0, items)`.
    pub fn next(&self, g: &mut Gen) -> u64 {
        let u = g.unit();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.items - 1);
        }
        let v = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        v.min(self.items - 1)
    }

    /// The next item in `[0, items)` after growing the count to `items`
    /// (never shrinks: YCSB's latest chooser only grows).
    pub fn next_of(&mut self, items: u64, g: &mut Gen) -> u64 {
        if items > self.items {
            self.zetan = zeta(self.items, items, self.theta, self.zetan);
            self.items = items;
            self.eta = self.eta_for(items);
        }
        self.next(g)
    }
}

/// YCSB's `ScrambledZipfianGenerator`: Zipfian popularity, with the
/// popular items spread over `[0, items)` by FNV hashing rather than
/// clustered at the low numbers.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    items: u64,
    zipf: Zipfian,
}

impl ScrambledZipfian {
    /// Over `items` items (at least 1).
    pub fn new(items: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            items: items.max(1),
            zipf: Zipfian::with_zetan(SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    /// The next item in `[0, items)`.
    pub fn next(&self, g: &mut Gen) -> u64 {
        fnv64(self.zipf.next(g)) % self.items
    }
}

/// How the keys of reads and updates are chosen.
#[derive(Clone, Debug)]
pub enum Chooser {
    /// Every loaded key alike.
    Uniform {
        /// Keys `0..items`.
        items: u64,
    },
    /// Scrambled Zipfian over the loaded keys.
    Zipf(ScrambledZipfian),
    /// Workload D: Zipfian over recency, the newest key the most popular.
    Latest(Zipfian),
}

impl Chooser {
    /// A position in `[0, items)`: for [`Chooser::Latest`], how many keys
    /// back from the newest (0 is the newest) among `items` keys, the
    /// count growing as keys are inserted; otherwise a key number among the
    /// loaded keys (and `items` is ignored).
    pub fn next(&mut self, items: u64, g: &mut Gen) -> u64 {
        match self {
            Chooser::Uniform { items } => g.below(*items),
            Chooser::Zipf(z) => z.next(g),
            Chooser::Latest(z) => z.next_of(items, g),
        }
    }
}

/// Length of the longest hashed key number (`u64::MAX / 2 + 1`, 19 digits).
const HASHED_DIGITS: usize = 19;
/// YCSB's key prefix.
pub const PREFIX: &str = "user";

/// Key names as YCSB builds them, padded to exactly `size` bytes: `user`
/// and the FNV-hashed key number (YCSB's default, `insertorder=hashed`),
/// zero-padded. Keys shorter than 23 bytes cannot hold a hashed number;
/// they use the key number itself (YCSB's `insertorder=ordered`), which
/// this store's hash index does not mind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyNames {
    size: usize,
    hashed: bool,
}

impl KeyNames {
    /// Names of exactly `size` bytes for key numbers below `max_keys`; an
    /// error if they do not fit.
    pub fn new(size: usize, max_keys: u64) -> Result<KeyNames, String> {
        let digits = max_keys.saturating_sub(1).max(1).ilog10() as usize + 1;
        if size >= PREFIX.len() + HASHED_DIGITS {
            Ok(KeyNames { size, hashed: true })
        } else if size >= PREFIX.len() + digits {
            Ok(KeyNames { size, hashed: false })
        } else {
            Err(format!(
                "keys of {size} bytes cannot name {max_keys} keys (YCSB names are 'user' and a number: \
                 at least {} bytes)",
                PREFIX.len() + digits
            ))
        }
    }

    /// Bytes per name.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The name of key number `n`, written into `out` (cleared first).
    /// Runs before every operation, so it neither allocates nor formats:
    /// the harness should leave the caches to the system under test.
    pub fn write(&self, n: u64, out: &mut Vec<u8>) {
        let mut num = if self.hashed { fnv64(n) } else { n };
        // u64::MAX has 20 digits.
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (num % 10) as u8;
            num /= 10;
            if num == 0 {
                break;
            }
        }
        let digits = &digits[start..];
        out.clear();
        out.extend_from_slice(PREFIX.as_bytes());
        let width = self.size - PREFIX.len();
        out.resize(out.len() + width.saturating_sub(digits.len()), b'0');
        out.extend_from_slice(digits);
    }

    /// The name of key number `n`.
    pub fn name(&self, n: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.size);
        self.write(n, &mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fnv_matches_ycsb() {
        // Utils.fnvhash64(0) and (1) in YCSB (Math.abs of a negative long).
        assert_eq!(fnv64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnv64(1), 8_517_097_267_634_966_620);
        for v in [2, 255, 256, 1 << 40, u64::MAX] {
            assert_eq!(fnv64(v), fnv_ref(v));
        }
        assert_ne!(fnv64(1), fnv64(2));
    }

    /// A direct transcription of YCSB's Java, with Java's wrapping `long`.
    fn fnv_ref(mut val: u64) -> u64 {
        let mut h: i64 = 0xCBF29CE484222325u64 as i64;
        for _ in 0..8 {
            let octet = (val & 0xff) as i64;
            val >>= 8;
            h ^= octet;
            h = h.wrapping_mul(1099511628211);
        }
        h.unsigned_abs()
    }

    #[test]
    fn zipf_shape_follows_the_power_law() {
        let n = 1000;
        let z = Zipfian::new(n);
        let mut g = Gen::new(7, 0);
        let mut counts = vec![0u64; n as usize];
        let draws = 400_000;
        for _ in 0..draws {
            counts[z.next(&mut g) as usize] += 1;
        }
        // Item 0 has probability 1/zeta(n): about 13.4% for n = 1000.
        let p0 = counts[0] as f64 / draws as f64;
        let expect0 = 1.0 / zeta(0, n, ZIPFIAN_CONSTANT, 0.0);
        assert!((p0 - expect0).abs() < 0.01, "p0 {p0} vs {expect0}");
        // Popularity falls about as 1/i: item 9 about a tenth of item 0.
        let ratio = counts[9] as f64 / counts[0] as f64;
        assert!((0.07..0.14).contains(&ratio), "{ratio}");
        // The top 10% of items draw most of the requests.
        let top: u64 = counts[..100].iter().sum();
        assert!(top as f64 / draws as f64 > 0.6, "{top}");
        assert!(counts.iter().filter(|&&c| c > 0).count() > 500, "the tail is reached");
    }

    #[test]
    fn scrambled_zipf_spreads_the_popular_keys() {
        let n = 10_000;
        let z = ScrambledZipfian::new(n);
        let mut g = Gen::new(3, 1);
        let mut counts = vec![0u64; n as usize];
        for _ in 0..200_000 {
            counts[z.next(&mut g) as usize] += 1;
        }
        let (hot, _) = counts.iter().enumerate().max_by_key(|(_, c)| **c).unwrap();
        // YCSB's most popular item is fnv(0) mod n, not 0.
        assert_eq!(hot as u64, fnv64(0) % n);
        // Item 0 of YCSB's ten billion has probability 1 / 26.47.
        let p0 = counts[hot] as f64 / 200_000.0;
        assert!((0.035..0.045).contains(&p0), "{p0}");
        // Skewed (uniform would give the top 10% a tenth of the requests),
        // though less than a plain Zipfian over n: YCSB's long tail over ten
        // billion items spreads evenly once hashed.
        let mut sorted = counts.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top: u64 = sorted[..n as usize / 10].iter().sum();
        assert!(top > 60_000, "skewed: the top 10% take {top} of 200000");
    }

    #[test]
    fn latest_prefers_the_newest_and_grows() {
        let mut c = Chooser::Latest(Zipfian::new(100));
        let mut g = Gen::new(1, 2);
        let draws: Vec<u64> = (0..10_000).map(|_| c.next(100, &mut g)).collect();
        let newest = draws.iter().filter(|&&d| d == 0).count();
        assert!(newest > 1000, "{newest}");
        assert!(draws.iter().all(|&d| d < 100));
        // The count grows: positions up to the new count appear.
        let grown: Vec<u64> = (0..50_000).map(|_| c.next(1000, &mut g)).collect();
        assert!(grown.iter().all(|&d| d < 1000) && grown.iter().any(|&d| d >= 100));
        // Extending zeta incrementally equals computing it afresh.
        let Chooser::Latest(z) = &c else { unreachable!() };
        let fresh = Zipfian::new(1000);
        assert!((z.zetan - fresh.zetan).abs() < 1e-9 && (z.eta - fresh.eta).abs() < 1e-9);
    }

    #[test]
    fn uniform_covers_the_keys() {
        let mut c = Chooser::Uniform { items: 10 };
        let mut g = Gen::new(5, 0);
        let mut counts = [0u32; 10];
        for _ in 0..10_000 {
            counts[c.next(0, &mut g) as usize] += 1;
        }
        assert!(counts.iter().all(|&n| (850..1150).contains(&n)), "{counts:?}");
    }

    #[test]
    fn key_names() {
        let k = KeyNames::new(24, 100_000).unwrap();
        let name = k.name(0);
        assert_eq!(name.len(), 24);
        assert!(name.starts_with(b"user"));
        assert_eq!(std::str::from_utf8(&name[4..]).unwrap().parse::<u64>().unwrap(), fnv64(0));
        let short = KeyNames::new(10, 100_000).unwrap();
        assert_eq!(short.name(42), b"user000042");
        assert!(KeyNames::new(8, 100_000).unwrap_err().contains("at least 9 bytes"));
        assert_eq!(KeyNames::new(5, 10).unwrap().name(9), b"user9");
    }

    proptest! {
        #[test]
        fn generators_replay_from_their_seed(seed: u64, index in 0u64..1000, n in 1u64..100_000) {
            let z = ScrambledZipfian::new(n);
            let (mut a, mut b) = (Gen::new(seed, index), Gen::new(seed, index));
            for _ in 0..32 {
                let x = z.next(&mut a);
                prop_assert_eq!(x, z.next(&mut b));
                prop_assert!(x < n);
            }
        }

        #[test]
        fn zipf_stays_in_range(seed: u64, n in 1u64..10_000, grow in 0u64..1000) {
            let mut z = Zipfian::new(n);
            let mut g = Gen::new(seed, 0);
            for _ in 0..64 {
                prop_assert!(z.next(&mut g) < n);
            }
            for _ in 0..64 {
                prop_assert!(z.next_of(n + grow, &mut g) < n + grow);
                prop_assert!(z.next(&mut g) < n + grow);
            }
        }

        #[test]
        fn names_are_distinct_and_sized(size in 23usize..64, a in 0u64..1_000_000, b in 0u64..1_000_000) {
            let k = KeyNames::new(size, 1_000_000).unwrap();
            prop_assert_eq!(k.name(a).len(), size);
            prop_assert_eq!(k.name(a) == k.name(b), a == b);
            let s = KeyNames::new(11, 1_000_000).unwrap();
            prop_assert_eq!(s.name(a) == s.name(b), a == b);
            prop_assert_eq!(s.name(a).len(), 11);
        }

        /// YCSB's names: "user" and the (hashed) number, zero-padded.
        #[test]
        fn names_are_ycsb_names(size in 11usize..64, n in 0u64..1_000_000) {
            let k = KeyNames::new(size, 1_000_000).unwrap();
            let num = if k.hashed { fnv64(n) } else { n };
            let want = format!("{PREFIX}{num:0>width$}", width = size - PREFIX.len());
            prop_assert_eq!(k.name(n), want.into_bytes());
        }
    }
}
