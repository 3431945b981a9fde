//! Rebuilding the activity log's table from the ring after a crash (or at any attach).
//!
//! Transactions are written one at a time, each synced before the next is built, so after
//! a crash the ring holds the newest transaction `n`, the `ring - 1` before it, except that
//! the block after the newest (where `n + 1` was being written) may be torn. An `Init`
//! block ends the search backwards: the table was empty there, older blocks do not matter.
//! Anything else invalid where a transaction belongs is corruption, refused.

use crate::al::format::{AlBlock, AlKind, EXTENT_NONE};
use crate::error::{AlBlockError, AlError};
use crate::layout::MD_BLOCK_BYTES;

/// What the ring says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlReplay {
    pub ring_blocks: u32,
    pub al_extents: u32,
    /// Slot → extent (`EXTENT_NONE` = empty), as of the newest transaction.
    pub table: Vec<u32>,
    /// The extents in the table, ascending: after a crash, mark each in full in every
    /// bitmap slot.
    pub hot: Vec<u32>,
    pub newest_seq: u64,
    /// The seq the next transaction must carry.
    pub next_seq: u64,
    /// Transactions the table was rebuilt from.
    pub replayed: u32,
    /// The block after the newest, if it was invalid: a transaction torn by a crash while
    /// being written. No write waited for it to finish, so ignoring it is safe.
    pub torn_block: Option<(u32, AlBlockError)>,
}

impl AlReplay {
    /// A ring of `ring_blocks` blocks holding only an `Init` at `seq` (what `create`
    /// writes).
    pub fn initialised(ring_blocks: u32, al_extents: u32, seq: u64) -> AlReplay {
        AlReplay {
            ring_blocks,
            al_extents,
            table: vec![EXTENT_NONE; al_extents as usize],
            hot: Vec::new(),
            newest_seq: seq,
            next_seq: seq + 1,
            replayed: 1,
            torn_block: None,
        }
    }
}

pub fn replay(blocks: &[[u8; MD_BLOCK_BYTES]]) -> Result<AlReplay, AlError> {
    let ring = blocks.len();
    if ring < 2 {
        return Err(AlError::RingTooSmall { blocks: ring });
    }
    let ring_u32 = u32::try_from(ring).expect("ring size fits u32");
    let decoded: Vec<Result<AlBlock, AlBlockError>> = blocks.iter().map(AlBlock::decode).collect();

    let mut newest: Option<usize> = None;
    let mut size: Option<(u32, u32)> = None; // (al_extents, block)
    for (i, d) in decoded.iter().enumerate() {
        let Ok(b) = d else { continue };
        let home = b.seq % ring as u64;
        if home != i as u64 {
            return Err(AlError::Misplaced {
                block: i as u32,
                seq: b.seq,
                home,
            });
        }
        match size {
            None => size = Some((b.al_extents, i as u32)),
            Some((e, other)) if e != b.al_extents => {
                return Err(AlError::SizeMismatch {
                    block: i as u32,
                    found: b.al_extents,
                    other,
                    expected: e,
                })
            }
            Some(_) => {}
        }
        if newest.is_none_or(|n| block(&decoded, n).seq < b.seq) {
            newest = Some(i);
        }
    }
    let Some(newest) = newest else {
        let first_problem = decoded[0].clone().expect_err("no block is valid");
        return Err(AlError::NoValidBlock { first_problem });
    };
    let newest_seq = block(&decoded, newest).seq;
    let al_extents = block(&decoded, newest).al_extents;

    // Newest first, back to an Init or `ring - 1` transactions back.
    let mut chain = vec![block(&decoded, newest)];
    let mut torn_block = None;
    for back in 1..ring as u64 {
        if chain.last().expect("non-empty").kind == AlKind::Init {
            break;
        }
        let Some(expected_seq) = newest_seq.checked_sub(back) else {
            break;
        };
        let idx = (expected_seq % ring as u64) as usize;
        // The block after the newest: where a crash may have torn transaction n + 1.
        let after_newest = back == ring as u64 - 1;
        match &decoded[idx] {
            Ok(b) if b.seq == expected_seq => chain.push(b),
            _ if after_newest => {
                if let Err(e) = &decoded[idx] {
                    torn_block = Some((idx as u32, e.clone()));
                }
                break;
            }
            Ok(b) => {
                return Err(AlError::UnexpectedSeq {
                    block: idx as u32,
                    expected_seq,
                    found_seq: b.seq,
                    newest_seq,
                })
            }
            Err(problem) => {
                return Err(AlError::Invalid {
                    block: idx as u32,
                    expected_seq,
                    newest_seq,
                    problem: problem.clone(),
                })
            }
        }
    }
    let table = rebuild(&chain, al_extents)?;
    let mut hot: Vec<u32> = table
        .iter()
        .copied()
        .filter(|&e| e != EXTENT_NONE)
        .collect();
    hot.sort_unstable();
    Ok(AlReplay {
        ring_blocks: ring_u32,
        al_extents,
        table,
        hot,
        newest_seq,
        next_seq: newest_seq + 1,
        replayed: chain.len() as u32,
        torn_block,
    })
}

fn block(decoded: &[Result<AlBlock, AlBlockError>], i: usize) -> &AlBlock {
    decoded[i].as_ref().expect("a valid block")
}

/// Applies `chain` (newest first) oldest to newest: each Update's window, then its slot
/// changes. Every slot must have been set by some transaction (or an Init).
fn rebuild(chain: &[&AlBlock], al_extents: u32) -> Result<Vec<u32>, AlError> {
    let mut table: Vec<Option<u32>> = vec![None; al_extents as usize];
    for b in chain.iter().rev() {
        match b.kind {
            AlKind::Init => table.iter_mut().for_each(|t| *t = Some(EXTENT_NONE)),
            AlKind::Update => {
                let start = b.context_start as usize;
                for (t, e) in table[start..start + b.context.len()]
                    .iter_mut()
                    .zip(&b.context)
                {
                    *t = Some(*e);
                }
                for u in &b.updates {
                    table[usize::from(u.slot)] = Some(u.extent);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(table.len());
    let mut slot_of = std::collections::HashMap::new();
    for (slot, t) in table.into_iter().enumerate() {
        let slot = slot as u32;
        let e = t.ok_or(AlError::Incomplete { slot })?;
        if e != EXTENT_NONE {
            if let Some(first) = slot_of.insert(e, slot) {
                return Err(AlError::DuplicateExtent {
                    extent: e,
                    first,
                    second: slot,
                });
            }
        }
        out.push(e);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::al::format::AlUpdate;

    const E: u32 = 1237; // two windows
    const RING: usize = 8;

    /// A ring after `create` plus the transactions that fill slot `t - 1` with extent
    /// `1000 + t` for t in 1..=n (each a single update), and the tables after each.
    fn history(n: u64) -> (Vec<[u8; MD_BLOCK_BYTES]>, Vec<Vec<u32>>) {
        let mut ring = vec![[0u8; MD_BLOCK_BYTES]; RING];
        ring[0] = *AlBlock::init(0, E).encode();
        let mut table = vec![EXTENT_NONE; E as usize];
        let mut tables = vec![table.clone()];
        for t in 1..=n {
            // Walk slots across both windows: slot (t * 97) % E.
            let slot = ((t * 97) % u64::from(E)) as u16;
            table[usize::from(slot)] = 1000 + t as u32;
            let b = AlBlock::update(
                t,
                vec![AlUpdate {
                    slot,
                    extent: 1000 + t as u32,
                }],
                &table,
            );
            ring[(t % RING as u64) as usize] = *b.encode();
            tables.push(table.clone());
        }
        (ring, tables)
    }

    #[test]
    fn fresh_ring() {
        let (ring, _) = history(0);
        let r = replay(&ring).unwrap();
        assert_eq!(r, AlReplay::initialised(RING as u32, E, 0));
    }

    #[test]
    fn after_many_transactions_with_wrap() {
        for n in [1, 3, 7, 8, 9, 20, 61] {
            let (ring, tables) = history(n);
            let r = replay(&ring).unwrap();
            assert_eq!(r.table, tables[n as usize], "n = {n}");
            assert_eq!((r.newest_seq, r.next_seq), (n, n + 1));
            assert_eq!(r.hot.len() as u64, n.min(E as u64));
            assert!(r.hot.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(r.torn_block, None);
        }
    }

    #[test]
    fn a_torn_newest_transaction_is_tolerated() {
        let (mut ring, tables) = history(19);
        // Transaction 20 goes to block 4 (over transaction 12): half of it landed. Their
        // windows (slots 0..888) differ past the first 2 KiB, so the tear shows.
        let (good, _) = history(20);
        assert_ne!(good[4][2048..], ring[4][2048..]);
        ring[4][..2048].copy_from_slice(&good[4][..2048]);
        let r = replay(&ring).unwrap();
        assert_eq!(r.newest_seq, 19);
        assert_eq!(r.table, tables[19]);
        let (block, problem) = r.torn_block.unwrap();
        assert_eq!(block, 4);
        assert!(matches!(problem, AlBlockError::Checksum { .. }));
        // The same tear anywhere else is corruption.
        let (mut ring, _) = history(19);
        ring[6][..2048].copy_from_slice(&history(22).0[6][..2048]);
        assert!(matches!(
            replay(&ring),
            Err(AlError::Invalid {
                block: 6,
                expected_seq: 14,
                ..
            })
        ));
    }

    #[test]
    fn a_corrupted_older_transaction_is_refused() {
        let (mut ring, _) = history(20);
        // Transaction 18 lives in block 2.
        ring[2][100] ^= 4;
        let err = replay(&ring).unwrap_err();
        assert!(
            matches!(
                err,
                AlError::Invalid {
                    block: 2,
                    expected_seq: 18,
                    newest_seq: 20,
                    problem: AlBlockError::Checksum { .. }
                }
            ),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains("block 2") && text.contains("18"), "{text}");
    }

    #[test]
    fn a_missing_transaction_is_refused() {
        let (mut ring, _) = history(20);
        ring[3] = [0; MD_BLOCK_BYTES]; // transaction 19
        assert!(matches!(
            replay(&ring).unwrap_err(),
            AlError::Invalid {
                block: 3,
                expected_seq: 19,
                problem: AlBlockError::Blank,
                ..
            }
        ));
    }

    #[test]
    fn an_old_transaction_in_place_of_a_newer_one_is_refused() {
        let (old, _) = history(12); // block 2 holds 10
        let (mut ring, _) = history(20); // block 2 holds 18
        ring[2] = old[2];
        assert!(matches!(
            replay(&ring).unwrap_err(),
            AlError::UnexpectedSeq {
                block: 2,
                expected_seq: 18,
                found_seq: 10,
                ..
            }
        ));
    }

    #[test]
    fn init_ends_the_search() {
        let (mut ring, _) = history(20);
        // Clean shutdown: an Init at 21 in block 5. Garbage older than it does not matter.
        ring[5] = *AlBlock::init(21, E).encode();
        ring[6] = [0x77; MD_BLOCK_BYTES];
        let r = replay(&ring).unwrap();
        assert_eq!((r.newest_seq, r.replayed), (21, 1));
        assert!(r.hot.is_empty());
    }

    #[test]
    fn misplaced_and_mixed_blocks_are_refused() {
        let (mut ring, _) = history(20);
        ring.swap(2, 3);
        assert!(matches!(
            replay(&ring).unwrap_err(),
            AlError::Misplaced {
                block: 2,
                seq: 19,
                home: 3
            }
        ));
        let (mut ring, _) = history(4);
        ring[6] = *AlBlock::init(6, 7).encode();
        assert!(matches!(
            replay(&ring).unwrap_err(),
            AlError::SizeMismatch {
                block: 6,
                found: 7,
                ..
            }
        ));
        let ring = vec![[0u8; MD_BLOCK_BYTES]; RING];
        assert!(matches!(
            replay(&ring).unwrap_err(),
            AlError::NoValidBlock {
                first_problem: AlBlockError::Blank
            }
        ));
    }

    /// Without an Init in reach, the windows of the last transactions must cover the
    /// table; a ring of 2 blocks for a two-window table cannot.
    #[test]
    fn an_uncovered_table_is_refused() {
        let table = vec![EXTENT_NONE; E as usize];
        let ring = vec![
            *AlBlock::update(10, vec![], &table).encode(),
            *AlBlock::update(11, vec![], &table).encode(),
        ];
        // 10 → window 0, 11 → window 1: covered.
        assert!(replay(&ring).is_ok());
        let ring = vec![
            [0u8; MD_BLOCK_BYTES],
            *AlBlock::update(11, vec![], &table).encode(),
        ];
        // Block 0 is "after the newest": tolerated, but then window 0 is missing.
        assert!(matches!(
            replay(&ring).unwrap_err(),
            AlError::Incomplete { slot: 0 }
        ));
    }

    #[test]
    fn duplicate_extents_are_refused() {
        let mut table = vec![EXTENT_NONE; 7];
        table[1] = 5;
        table[3] = 5;
        let ring = vec![
            *AlBlock::init(0, 7).encode(),
            *AlBlock::update(1, vec![], &table).encode(),
            [0u8; MD_BLOCK_BYTES],
        ];
        assert!(matches!(
            replay(&ring).unwrap_err(),
            AlError::DuplicateExtent {
                extent: 5,
                first: 1,
                second: 3
            }
        ));
    }
}
