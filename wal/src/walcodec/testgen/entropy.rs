//! Where the generator's choices come from, and what tests do with its output afterwards.

/// A source of choices: a seeded [`Rng`] (tests) or a fuzzer's input ([`Src`]).
pub trait Entropy {
    /// 64 bits.
    fn next_u64(&mut self) -> u64;

    fn u8(&mut self) -> u8 {
        self.next_u64() as u8
    }
    fn u16(&mut self) -> u16 {
        self.next_u64() as u16
    }
    fn u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
    /// Bytes that look like tuple data: mostly small integers and repeats.
    fn tuple(&mut self, n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| {
                if self.below(4) == 0 {
                    self.u8()
                } else {
                    (i % 7) as u8
                }
            })
            .collect()
    }
    /// Whether every further choice is a default (a fuzzer's input that is used up).
    fn exhausted(&self) -> bool {
        false
    }
}

impl<E: Entropy + ?Sized> Entropy for &mut E {
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
    fn u8(&mut self) -> u8 {
        (**self).u8()
    }
    fn u16(&mut self) -> u16 {
        (**self).u16()
    }
    fn u32(&mut self) -> u32 {
        (**self).u32()
    }
    fn below(&mut self, n: u64) -> u64 {
        (**self).below(n)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (**self).bytes(n)
    }
    fn tuple(&mut self, n: usize) -> Vec<u8> {
        (**self).tuple(n)
    }
    fn exhausted(&self) -> bool {
        (**self).exhausted()
    }
}

/// Small deterministic PRNG (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
}

impl Entropy for Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A fuzzer's input read front to back: each choice takes as few bytes as it needs
/// (little-endian); once the input is used up every choice is 0.
#[derive(Clone, Debug)]
pub struct Src<'a> {
    pub b: &'a [u8],
}

impl<'a> Src<'a> {
    pub fn new(b: &'a [u8]) -> Src<'a> {
        Src { b }
    }

    /// The next `n` bytes of the input (fewer where it ends).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, rest) = self.b.split_at(n.min(self.b.len()));
        self.b = rest;
        a
    }

    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    fn le(&mut self, n: usize) -> u64 {
        self.take(n)
            .iter()
            .rev()
            .fold(0, |v, &b| v << 8 | u64::from(b))
    }
}

impl Entropy for Src<'_> {
    fn next_u64(&mut self) -> u64 {
        self.le(8)
    }
    fn u8(&mut self) -> u8 {
        self.le(1) as u8
    }
    fn u16(&mut self) -> u16 {
        self.le(2) as u16
    }
    fn u32(&mut self) -> u32 {
        self.le(4) as u32
    }
    fn below(&mut self, n: u64) -> u64 {
        let v = match n {
            0 => return 0,
            1..=0x100 => self.le(1),
            0x101..=0x1_0000 => self.le(2),
            0x1_0001..=0x1_0000_0000 => self.le(4),
            _ => self.le(8),
        };
        v % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.take(n).to_vec();
        v.resize(n, 0);
        v
    }
    fn exhausted(&self) -> bool {
        self.b.is_empty()
    }
}

/// Flips bytes of `wal` at chosen places (each: a u16 position, a non-zero xor byte).
pub fn corrupt(e: &mut impl Entropy, wal: &mut [u8], count: usize) {
    for _ in 0..count {
        let at = usize::from(e.u16());
        let x = e.u8();
        if let Some(b) = wal.get_mut(at) {
            *b ^= x.max(1);
        }
    }
}

/// Splits `len` bytes into message lengths of 1..=`max` chosen by `e` (the rest as one
/// message once `e` is exhausted).
pub fn split(e: &mut impl Entropy, len: usize, max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut left = len;
    while left > 0 {
        let n = if e.exhausted() {
            left
        } else {
            (1 + usize::from(e.u16()) * 2 % max).min(left)
        };
        v.push(n);
        left -= n;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn src_reads_little_endian_then_zeros() {
        let mut s = Src::new(&[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(s.u16(), 0x0201);
        assert_eq!(s.below(300), 0x0403 % 300);
        assert_eq!(s.bytes(5), [5, 6, 7, 0, 0]);
        assert!(s.exhausted());
        assert_eq!((s.u8(), s.u32(), s.next_u64(), s.below(9)), (0, 0, 0, 0));
    }

    #[test]
    fn rng_is_deterministic_and_spreads() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        let xs: Vec<u64> = (0..100).map(|_| a.below(10)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(10)).collect();
        assert_eq!(xs, ys);
        assert!((0..10).all(|d| xs.contains(&d)), "{xs:?}");
    }

    #[test]
    fn split_covers_the_length() {
        let mut s = Src::new(&[9, 0, 200, 1]);
        let parts = split(&mut s, 5000, 1000);
        assert_eq!(parts.iter().sum::<usize>(), 5000);
        assert!(parts[..parts.len() - 1]
            .iter()
            .all(|&n| (1..=1000).contains(&n)));
    }
}
