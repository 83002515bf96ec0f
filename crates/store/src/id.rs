//! Task ids: `task_` and a ULID (48-bit millisecond time, 80 random bits) in
//! Crockford base32, made by the client as the protocol requires.

use std::time::{SystemTime, UNIX_EPOCH};

use rand::RngCore;

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A fresh task id, such as `task_01JDQ7Z8W3V5M6N0P9R2S4T6X8`.
pub fn new_task_id() -> String {
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let mut random = [0u8; 10];
    rand::thread_rng().fill_bytes(&mut random);
    task_id_from_parts(millis as u64, random)
}

/// The id for a given time and randomness (exposed for tests).
pub fn task_id_from_parts(millis: u64, random: [u8; 10]) -> String {
    let mut bits: u128 = u128::from(millis & 0xFFFF_FFFF_FFFF) << 80;
    for (i, byte) in random.iter().enumerate() {
        bits |= u128::from(*byte) << (8 * (9 - i));
    }
    let mut out = String::with_capacity(31);
    out.push_str("task_");
    // 26 characters of 5 bits cover 130 bits; the top two are always zero.
    for i in (0..26).rev() {
        let index = ((bits >> (5 * i)) & 0x1F) as usize;
        out.push(char::from(CROCKFORD[index]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_protocol_shape() {
        let id = new_task_id();
        assert_eq!(id.len(), 31);
        assert!(id.starts_with("task_"));
        assert!(id[5..].bytes().all(|b| CROCKFORD.contains(&b)), "{id}");
        assert_ne!(new_task_id(), new_task_id());
    }

    #[test]
    fn time_leads_so_ids_sort_by_creation_millisecond() {
        let a = task_id_from_parts(1_700_000_000_000, [0xFF; 10]);
        let b = task_id_from_parts(1_700_000_000_001, [0; 10]);
        assert!(a < b);
        assert_eq!(task_id_from_parts(0, [0; 10]), "task_00000000000000000000000000");
        assert_eq!(&task_id_from_parts(0, [0xFF; 10])[5..15], "0000000000");
        assert_eq!(&task_id_from_parts(0, [0xFF; 10])[15..], "ZZZZZZZZZZZZZZZZ");
    }
}
