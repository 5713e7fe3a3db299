//! A short, stable, non-cryptographic hash for names and ids derived from text.

/// 32-bit FNV-1a of `s`.
pub fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    h
}
