use super::{KvCache, KvPart, KvSpan, KvSpec, Pool};
use crate::config::Config;

pub(crate) fn cfg() -> Config {
    Config {
        n_layer: 1,
        n_head: 1,
        n_embd: 2,
        n_positions: 64,
        n_inner: 8,
        vocab_size: 100,
        layer_norm_epsilon: 1e-5,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
        bos_token_id: 0,
        eos_token_id: 0,
    }
}

/// The made-up K/V of `ids` at positions 0..: K = (id, p), V = (−id, p).
fn span_of(ids: &[u32]) -> KvSpan {
    let mut data = vec![];
    for sign in [1.0, -1.0] {
        for (p, &id) in ids.iter().enumerate() {
            data.extend([sign * id as f32, p as f32]);
        }
    }
    KvSpan { len: ids.len(), n_layer: 1, n_head: 1, head_dim: 2, data }
}

/// A cache holding `ids` at positions 0.., with the made-up K/V.
pub(crate) fn cache_of(ids: &[u32]) -> KvCache {
    cache_in_blocks(ids, super::DEFAULT_BLOCK)
}

/// [`cache_of`] in blocks of `b` positions.
pub(crate) fn cache_in_blocks(ids: &[u32], b: usize) -> KvCache {
    let mut cache = KvCache::with_spec(&cfg(), 64, KvSpec::new(b).unwrap());
    cache.append_span(&span_of(ids), 0, ids.len()).unwrap();
    cache
}

#[test]
fn same_bits_compares_the_positions_whatever_the_blocks() {
    let a = cache_of(&[1, 2, 3]); // blocks of 16
    for block in [1, 2, 64] {
        let mut b = KvCache::with_spec(&cfg(), 3, KvSpec::new(block).unwrap());
        b.append_span(&a.span(0, 3), 0, 3).unwrap();
        assert!(a.same_bits(&b, 3) && b.same_bits(&a, 3));
        assert_eq!(b.gather(0, KvPart::V), a.gather(0, KvPart::V));
        b.nudge(0, KvPart::V, 0, 2, 0, 1.0);
        assert!(!a.same_bits(&b, 3), "one value differs");
        assert!(a.same_bits(&b, 2), "the positions before it do not");
    }
}

#[test]
fn blocks_come_as_positions_arrive_and_go_back_when_let_go() {
    let pool = Pool::new(&cfg(), KvSpec::new(4).unwrap(), 3); // 3 blocks of 4 positions
    let mut a = KvCache::in_pool(&pool, &cfg(), 64);
    assert_eq!((pool.used_blocks(), a.blocks_needed(5)), (0, 2));
    a.append_span(&span_of(&[1, 2, 3, 4, 5]), 0, 5).unwrap();
    assert_eq!(pool.used_blocks(), 2, "five positions take two blocks of four");
    let mut b = KvCache::in_pool(&pool, &cfg(), 64);
    let err = b.append_span(&span_of(&[1; 8]), 0, 8).unwrap_err();
    assert!(err.to_string().contains("2 more blocks are needed and 1 of its 3 are free"), "{err}");
    assert_eq!((b.len(), pool.used_blocks()), (0, 2), "a refused reserve takes nothing");
    a.truncate(4);
    assert_eq!(pool.used_blocks(), 1, "the block that held only position 4 went back");
    drop(a);
    assert_eq!(pool.used_blocks(), 0);
    b.append_span(&span_of(&[1; 8]), 0, 8).unwrap();
    assert_eq!(pool.used_blocks(), 2);
}

#[test]
fn a_shared_block_is_copied_before_it_is_written() {
    let pool = Pool::new(&cfg(), KvSpec::new(4).unwrap(), 8);
    let a = {
        let mut a = KvCache::in_pool(&pool, &cfg(), 64);
        a.append_span(&span_of(&[1, 2, 3, 4, 5, 6]), 0, 6).unwrap();
        a
    };
    // b maps a's two blocks (positions 0..6) and goes on from position 6 with other tokens.
    let mut b = KvCache::in_pool(&pool, &cfg(), 64);
    b.blocks = a.blocks.clone();
    b.len = 6;
    assert_eq!((pool.used_blocks(), b.blocks_needed(3)), (2, 2), "a copy of the shared second block, and a new one");
    b.append_span(&span_of(&[9, 9, 9, 9, 9, 9, 7, 8, 9]), 6, 9).unwrap();
    assert_eq!(pool.used_blocks(), 4);
    assert!(std::sync::Arc::ptr_eq(&a.blocks[0], &b.blocks[0]), "the whole first block stays shared");
    assert!(a.same_bits(&b, 6), "positions 0..6 are the same in both");
    assert_eq!(a.gather(0, KvPart::K), span_of(&[1, 2, 3, 4, 5, 6]).head(0, 0, 0).to_vec(), "a is unchanged");
    assert_eq!(b.gather(0, KvPart::K)[12..], [7.0, 6.0, 8.0, 7.0, 9.0, 8.0]);
}
