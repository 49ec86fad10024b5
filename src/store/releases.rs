//! Expand and contract: what a migration keeps in place for the previous
//! release while replicas of both run side by side (docs/upgrading.md).
//!
//! A migration of this service only ever expands for one release: the
//! previous release keeps working against the migrated schema. What it
//! keeps for that release is an [`Expansion`], dropped later by
//! `order-timeout migrate --contract`, once no replica of that release runs.
//! `migrate` on a database that had none of the service's tables contracts
//! at once ([`Migrated::fresh`]): no earlier release ever ran against it.

/// One thing a migration keeps for the previous release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expansion {
    /// The object kept (an index of the service's own tables).
    pub object: &'static str,
    /// The release that needs it.
    pub kept_for: &'static str,
    /// What waits for its contraction.
    pub blocks: &'static str,
    /// A query of one boolean: whether it is in place.
    pub present: &'static str,
    /// The statement that drops it (`migrate --contract`).
    pub drop: &'static str,
    /// Where no migration keeps it: the first migration of the release
    /// after `kept_for`, and the statement `migrate` runs, after the
    /// migrations, on a database that had the service's tables and none
    /// of the migrations from that one on (one `kept_for` ran on).
    pub keep: Option<(i64, &'static str)>,
}

/// The outbox's order ids unique on their own (PostgreSQL, migration
/// `20261130000001`): 0.1.0 writes its rows with `ON CONFLICT (order_id)`,
/// and one order can only have a row per timer once it is gone.
pub(crate) const OUTBOX_ORDER_ID_UNIQUE: Expansion = Expansion {
    object: "order_timeout_cancel_outbox_order_id",
    kept_for: "0.1.0",
    blocks: "a timer other than cancel_unpaid ([[timers]])",
    present: "SELECT to_regclass('order_timeout_cancel_outbox_order_id') IS NOT NULL",
    // A short lock on the service's own table, none on the shop's.
    drop: "DROP INDEX IF EXISTS order_timeout_cancel_outbox_order_id",
    keep: None,
};

/// MySQL/MariaDB: a marker row of `order_timeout_watch` (`kept_for:0.1.0`,
/// a timer name no timer can have: `:` and `.`), written by `migrate` on a
/// database 0.1.0 ran on.
/// 0.1.0's outbox statements name no timer, so a 0.1.0 sweeper would take
/// over another timer's pending outbox row of the same id (coupons 1..N
/// beside orders 1..N), publish a second `order.cancelled` and mark that
/// timer's event as published. Nothing in the schema is kept for 0.1.0 on
/// MySQL (its `ON DUPLICATE KEY` works with the new key), so the marker is
/// what keeps `[[timers]]` refused until `migrate --contract`, as on
/// PostgreSQL. A row, not a table: the service's least-privileged user
/// reads it (`information_schema` hides tables it has no grant on).
pub(crate) const KEPT_FOR_0_1_0_MYSQL: Expansion = Expansion {
    object: "order_timeout_watch row kept_for:0.1.0",
    kept_for: "0.1.0",
    blocks: "a timer other than cancel_unpaid ([[timers]])",
    present: "SELECT EXISTS (SELECT 1 FROM order_timeout_watch WHERE timer = 'kept_for:0.1.0')",
    drop: "DELETE FROM order_timeout_watch WHERE timer = 'kept_for:0.1.0'",
    keep: Some((
        20261201000001,
        "INSERT INTO order_timeout_watch (timer, scanned_until) \
         VALUES ('kept_for:0.1.0', UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE timer = timer",
    )),
};

/// What `migrate` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// The database had none of the service's tables before: the expand
    /// steps were contracted at once.
    pub fresh: bool,
    /// What the migrations keep for the previous release, in place now.
    pub kept: Vec<Expansion>,
}

/// The refusal of a timer other than `cancel_unpaid` while `kept` (present
/// expansions) still constrain the outbox.
pub(crate) fn refuse_timers(kept: &[Expansion]) -> Option<String> {
    let e = kept.first()?;
    Some(format!(
        "the outbox still keeps {} for {} replicas, which {} cannot run beside: \
         once no {} replica runs, run `order-timeout migrate --contract` \
         (docs/upgrading.md), then start this config",
        e.object, e.kept_for, e.blocks, e.kept_for
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_are_refused_only_while_an_expansion_is_kept() {
        assert_eq!(refuse_timers(&[]), None);
        let why = refuse_timers(&[OUTBOX_ORDER_ID_UNIQUE]).unwrap();
        assert!(why.contains("migrate --contract"), "{why}");
        assert!(why.contains("0.1.0"), "{why}");
    }
}
