//! Settling the consuming channel's deliveries in as few frames as is safe.
//!
//! Every delivery is acked only after its work is confirmed, one order at a
//! time in the code that finishes it; but a batch finishes many orders at
//! once. Acked one frame each, a batch of 20 cost 20 trips through the
//! client's I/O loop and 20 settlements in the quorum queue's log. AMQP's
//! `basic.ack` with `multiple` settles every unsettled delivery up to a tag
//! in one frame — including deliveries still being worked on, whose loss on
//! a crash that would be. So [`Acks`] keeps the tags the channel has
//! delivered and not yet settled, and acks a set of tags with one
//! `multiple` frame only for those below every other open tag; the rest go
//! one frame each (sent together).
//!
//! Delivery tags grow with every delivery on a channel, so a delivery not
//! yet recorded (it arrived while a frame was being chosen) has a higher tag
//! than any recorded one and is never covered. Frames are chosen and sent
//! under one lock, in order: a `multiple` frame can never overtake the
//! single ack or nack of a tag below it, which the broker would refuse as an
//! unknown tag (and close the channel).

use std::collections::BTreeSet;
use std::sync::Mutex;

use futures_util::future::try_join_all;
use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::DeliveryTag;

/// The open (delivered, not yet settled) deliveries of one consuming
/// channel, and the only way they are settled. One per channel: tags mean
/// nothing on another.
pub struct Acks {
    channel: Channel,
    open: Mutex<BTreeSet<DeliveryTag>>,
    /// Held while frames are chosen and sent, so they reach the broker in
    /// the order they were chosen.
    sending: tokio::sync::Mutex<()>,
}

impl Acks {
    /// Settles deliveries of `channel`.
    pub fn new(channel: Channel) -> Self {
        Self {
            channel,
            open: Mutex::new(BTreeSet::new()),
            sending: tokio::sync::Mutex::new(()),
        }
    }

    /// Records a delivery as open. Called for every delivery as it is taken
    /// from the channel, before anything can settle it.
    pub fn taken(&self, tag: DeliveryTag) {
        self.lock_open().insert(tag);
    }

    /// How many deliveries are open.
    pub fn open(&self) -> usize {
        self.lock_open().len()
    }

    /// Acks the deliveries `tags` (open ones; others are skipped: they are
    /// settled already). One `multiple` frame for those below every other
    /// open delivery, one frame each for the rest.
    pub async fn ack(&self, tags: &[DeliveryTag]) -> Result<(), lapin::Error> {
        let _order = self.sending.lock().await;
        let frames = {
            let mut open = self.lock_open();
            let mut mine: Vec<DeliveryTag> =
                tags.iter().copied().filter(|t| open.remove(t)).collect();
            mine.sort_unstable();
            ack_frames(&mine, open.first().copied())
        };
        let sends = frames
            .into_iter()
            .map(|(tag, multiple)| self.channel.basic_ack(tag, BasicAckOptions { multiple }));
        // The frames of one call settle disjoint tags, so their order among
        // themselves does not matter; the lock orders them against others'.
        try_join_all(sends).await.map(drop)
    }

    /// Returns the delivery `tag` to its queue (a nack with requeue).
    pub async fn requeue(&self, tag: DeliveryTag) -> Result<(), lapin::Error> {
        let _order = self.sending.lock().await;
        if !self.lock_open().remove(&tag) {
            return Ok(());
        }
        self.channel
            .basic_nack(
                tag,
                BasicNackOptions {
                    requeue: true,
                    multiple: false,
                },
            )
            .await
    }

    fn lock_open(&self) -> std::sync::MutexGuard<'_, BTreeSet<DeliveryTag>> {
        // The set is never left half-changed: a poisoned lock's data is
        // still right.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The ack frames `(tag, multiple)` for the sorted open tags `mine` when
/// `first_other` is the lowest open tag not among them: those below it in
/// one frame (a `multiple` one when there are several), the others one
/// frame each.
fn ack_frames(mine: &[DeliveryTag], first_other: Option<DeliveryTag>) -> Vec<(DeliveryTag, bool)> {
    let below = first_other.map_or(mine.len(), |other| mine.partition_point(|t| *t < other));
    let mut frames = Vec::with_capacity(1 + mine.len() - below);
    if below > 0 {
        frames.push((mine[below - 1], below > 1));
    }
    frames.extend(mine[below..].iter().map(|t| (*t, false)));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_below_every_other_open_one_go_in_one_multiple_frame() {
        assert_eq!(ack_frames(&[3, 4, 5], None), vec![(5, true)]);
        assert_eq!(ack_frames(&[3, 4, 5], Some(9)), vec![(5, true)]);
        assert_eq!(ack_frames(&[7], None), vec![(7, false)]);
        assert_eq!(ack_frames(&[], Some(2)), vec![]);
    }

    #[test]
    fn tags_above_an_open_one_go_one_frame_each() {
        // 4 is still being worked on: a multiple frame up to 5 or 6 would
        // settle it too.
        assert_eq!(
            ack_frames(&[1, 2, 3, 5, 6], Some(4)),
            vec![(3, true), (5, false), (6, false)]
        );
        assert_eq!(ack_frames(&[5, 6], Some(4)), vec![(5, false), (6, false)]);
        assert_eq!(ack_frames(&[2, 5], Some(4)), vec![(2, false), (5, false)]);
    }
}
