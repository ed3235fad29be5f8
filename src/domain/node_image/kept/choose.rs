//! Which of the previous image's layers to keep: a choice over the whole
//! set, from its documents alone.
//!
//! The chain a puller reuses ends at the first of the previous image's
//! layers (after the base's) the new image does not have in its place. So
//! keeping helps only as a prefix of the dropped layers: keeping the first
//! k of them moves the break to the (k+1)-th, and upgraders then reuse
//! the shared layers before it; a kept layer past a break saves nothing.
//! Each k is weighed whole: what upgraders save (the shared bytes that
//! come before the new break and not before the old one) against what
//! every first pull pays (the kept bytes), within the share
//! (`--keep-previous-layers`) and the layer budget. The best k wins, the
//! smallest on a tie, none when no k saves more than it costs. A kept set
//! that has stopped paying for itself (the releases since moved what it
//! bridged) is so dropped at once, and the build says so: that release's
//! upgraders pull the layers after the break again, and first pulls shed
//! the kept bytes.

use std::collections::HashSet;

use crate::primitives::digest::Digest;
use crate::primitives::oci::Descriptor;

use super::super::LayerBlob;

/// What may be kept: the previous image's layers (its whole list), the
/// base's, how many layers the budget leaves ([`super::super::plan::budget`],
/// the build's own layer counted) and the percentage.
pub struct Keep<'a> {
    pub previous: &'a [Descriptor],
    pub base: &'a [Descriptor],
    pub room: usize,
    pub percent: u8,
}

/// The choice and what it does to pullers (bytes of blobs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Choice {
    /// The layers to keep, in the previous image's order.
    pub keep: Vec<Descriptor>,
    /// Shared bytes upgraders reuse thanks to them.
    pub saves: u64,
    /// What first pulls pay for them.
    pub costs: u64,
    /// The first dropped layer not kept, where the chain now breaks, if
    /// shared layers follow it, and the shared bytes upgraders pull again.
    pub breaks: Option<(Digest, u64)>,
    /// Why nothing could be weighed at all.
    pub none_because: Option<&'static str>,
}

impl Keep<'_> {
    /// The best prefix of at most `limit` dropped layers ([module doc](super));
    /// `new` is kiln's new layers in any order. Layers a check refused cut
    /// the prefix (the caller lowers `limit` and asks again).
    pub fn choose<'l>(&self, new: impl IntoIterator<Item = &'l LayerBlob>, limit: usize) -> Choice {
        let (previous, base) = (self.previous, self.base);
        let built_on_base = previous.len() >= base.len()
            && previous.iter().zip(base).all(|(p, b)| p.digest == b.digest);
        if !built_on_base {
            return Choice {
                none_because: Some("it was built on another base (the chain breaks at the base)"),
                ..Default::default()
            };
        }
        let tail = &previous[base.len()..];
        let (mut new_digests, mut new_bytes) = (HashSet::new(), 0u64);
        for l in new {
            if new_digests.insert(&l.digest) {
                new_bytes += l.size;
            }
        }
        // The dropped layers, in order, each once, and where each sits.
        let mut seen = HashSet::new();
        let dropped: Vec<(usize, &Descriptor)> = tail
            .iter()
            .enumerate()
            .filter(|(_, l)| !new_digests.contains(&l.digest) && seen.insert(&l.digest))
            .collect();
        // Shared bytes before each position (a layer shared twice counts once).
        let mut before = Vec::with_capacity(tail.len() + 1);
        let (mut sum, mut counted) = (0u64, HashSet::new());
        for l in tail {
            before.push(sum);
            if new_digests.contains(&l.digest) && counted.insert(&l.digest) {
                sum += l.size;
            }
        }
        before.push(sum);
        let shared_total = sum;
        let reused = |k: usize| dropped.get(k).map_or(shared_total, |(at, _)| before[*at]);
        let cap = new_bytes * u64::from(self.percent) / 100;
        let room = self.room.saturating_sub(new_digests.len());
        let keepable = dropped
            .iter()
            .take_while(|(_, l)| super::check::kept_media_type(&l.media_type).is_some())
            .count();
        let most = limit.min(room).min(keepable);
        let (mut best, mut best_net, mut cost) = (0usize, 0i128, 0u64);
        for k in 1..=most {
            cost += dropped[k - 1].1.size;
            if cost > cap {
                break;
            }
            let net = i128::from(reused(k)) - i128::from(reused(0)) - i128::from(cost);
            if net > best_net {
                (best, best_net) = (k, net);
            }
        }
        let keep: Vec<Descriptor> = dropped[..best].iter().map(|(_, l)| (*l).clone()).collect();
        let costs = keep.iter().map(|l| l.size).sum();
        let again = shared_total - reused(best);
        Choice {
            saves: reused(best) - reused(0),
            costs,
            breaks: dropped
                .get(best)
                .filter(|_| again > 0)
                .map(|(_, l)| (l.digest.clone(), again)),
            keep,
            none_because: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::oci::media;

    fn d(name: &str, size: u64) -> Descriptor {
        Descriptor::new(media::OCI_LAYER_GZIP, Digest::of(name.as_bytes()), size)
    }

    fn blob(name: &str, size: u64) -> LayerBlob {
        LayerBlob::named(name, size)
    }

    fn names(ds: &[Descriptor]) -> Vec<Digest> {
        ds.iter().map(|d| d.digest.clone()).collect()
    }

    /// An image's dropped blob mid-chain is kept; one after the last
    /// shared layer (nothing to save) is not (issue 44, bench (n)).
    #[test]
    fn a_dropped_layer_mid_chain_is_kept_and_one_at_the_end_is_not() {
        let base = [d("base", 100)];
        let previous = [
            d("base", 100),
            d("shared-a", 50),
            d("dropped", 20),
            d("shared-b", 60),
            d("old-docs", 1),
            d("old-node", 1),
        ];
        let new = [
            blob("shared-a", 50),
            blob("shared-b", 60),
            blob("fresh", 30),
            blob("docs", 1),
            blob("node", 1),
        ];
        let keep = |base: &[Descriptor], room: usize, percent: u8| {
            Keep {
                previous: &previous,
                base,
                room,
                percent,
            }
            .choose(&new, usize::MAX)
        };
        let c = keep(&base, 10, 25);
        assert_eq!(names(&c.keep), [Digest::of(b"dropped")]);
        assert_eq!((c.saves, c.costs, c.breaks), (60, 20, None));
        // Built on another base: nothing is kept, and why.
        assert!(keep(&[d("other", 100)], 10, 25).none_because.is_some());
        // No room left in the layer budget; --keep-previous-layers 0: the
        // chain breaks at the dropped layer, and upgraders pull 60 again.
        for c in [keep(&base, new.len(), 25), keep(&base, 10, 0)] {
            assert!(c.keep.is_empty());
            assert_eq!(c.breaks, Some((Digest::of(b"dropped"), 60)));
        }
    }

    /// The set is weighed whole: a large first layer is worth keeping
    /// when, with the next one, it bridges to much; a saving past a later
    /// break is not counted (issue 53.7).
    #[test]
    fn the_kept_set_is_chosen_whole_and_saves_only_up_to_the_next_break() {
        let base = [d("base", 10)];
        let keep = |previous: &[Descriptor], new: &[LayerBlob], percent: u8, limit: usize| {
            Keep {
                previous,
                base: &base,
                room: 20,
                percent,
            }
            .choose(new, limit)
        };
        // dropped-1 (40) saves only shared-a (10) alone: not worth it; with
        // dropped-2 (5) it bridges to shared-b (200).
        let previous = [
            d("base", 10),
            d("dropped-1", 40),
            d("shared-a", 10),
            d("dropped-2", 5),
            d("shared-b", 200),
        ];
        let new = [
            blob("shared-a", 10),
            blob("shared-b", 200),
            blob("fresh", 100),
        ];
        let c = keep(&previous, &new, 50, usize::MAX);
        assert_eq!(
            names(&c.keep),
            [Digest::of(b"dropped-1"), Digest::of(b"dropped-2")]
        );
        assert_eq!((c.saves, c.costs), (210, 45));
        // A check refused dropped-2: dropped-1 alone costs more than it saves.
        let c = keep(&previous, &new, 50, 1);
        assert!(c.keep.is_empty());
        assert_eq!(c.breaks, Some((Digest::of(b"dropped-1"), 210)));
        // A 40 MiB layer before a break saves only what lies before it.
        let previous = [
            d("base", 10),
            d("big", 40),
            d("shared-a", 10),
            d("gone", 30),
            d("shared-b", 500),
        ];
        let new = [
            blob("shared-a", 10),
            blob("shared-b", 500),
            blob("fresh", 300),
        ];
        // Within 5 %: only big (40) fits, which saves 10: nothing kept.
        assert!(keep(&previous, &new, 5, usize::MAX).keep.is_empty());
        // Within 10 % (81): both, saving 510 for 70.
        assert_eq!(keep(&previous, &new, 10, usize::MAX).keep.len(), 2);
    }
}
