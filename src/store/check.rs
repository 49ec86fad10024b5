//! **The schema check**, once per timer before its first statement: the
//! service's outbox and the shop's tables read, the mapping checked
//! against their columns (identifiers, id and status types, the status
//! codes distinct in the column's own collation, the items table), every
//! statement rendered and prepared with the parameters the service binds,
//! the `also` statements' parameters typed, and what `schema check` prints.

use super::catalog::Columns;
use super::ids::IdColumn;
use super::outbox::Mapped;
use super::shape::{self, OrdersColumns, SchemaReport};
use super::sql::{Check, Prepared, SqlDialect, SqlStore, first_column_type, tables_shape};
use super::zones::{self, DeadlineKind, ZoneReport};
use super::{Dialect, StoreError, releases, shop};
use crate::settings::{Release, TimerKey};

impl<D: SqlDialect> SqlStore<D> {
    /// Reads the service's outbox and the shop's tables, checks the
    /// mapping, renders and prepares every statement.
    #[tracing::instrument(skip_all)]
    pub(super) async fn check(&self) -> Result<Prepared<D>, StoreError> {
        let t = &self.timer;
        shape::check_orders_identifiers(t)?;
        D::check_zone(self).await?;
        let outbox = D::columns(self, shape::OUTBOX).await?;
        shape::check_outbox_columns(&outbox, D::OUTBOX_COLUMNS)?;
        shape::check_set_aside(&D::columns(self, shape::SET_ASIDE).await?)?;
        if !t.is_default()
            && let Some(problem) = releases::refuse_timers(&self.expansions().await?)
        {
            return Err(StoreError::Schema {
                key: "[[timers]]",
                problem,
            });
        }
        let orders_columns = D::columns(self, &t.table).await?;
        let orders = shape::check_orders_columns(t, &orders_columns)?;
        let zone = self.read_zone(self.check_deadline_type().await?).await?;
        self.check_codes_differ(&orders).await?;
        let items_columns = match t.release {
            Release::Grpc => Some(D::columns(self, &t.items.table).await?),
            Release::None => None,
        };
        let items = items_columns
            .as_ref()
            .map(|columns| self.check_items(columns))
            .transpose()?;
        let sql = D::statements(self, &orders).await?;
        let items_base = items.as_ref().map(|(_, base)| base.as_str());
        let mapped = shop::mapped::<D>(t, &orders, items_base, zone.shifts());
        // The statements first: a placeholder in the guard would make the
        // count fail with a less helpful error.
        let also_params = self.check_statements(&mapped).await?;
        let also_keys = self.check_also_keys().await?;
        let (waiting, due, newest) = self.count_waiting(&mapped).await?;
        let unvacuumed = D::unvacuumed(self, &[&t.table, shape::OUTBOX]).await?;
        let shape = tables_shape(t, &orders_columns, items_columns.as_ref());
        Ok(Prepared {
            shape,
            sql,
            mapped,
            id: orders.id.clone(),
            id_key: self.timer.key(TimerKey::Id),
            items_id: items.map(|(column, _)| column),
            also_params,
            also_keys,
            report: SchemaReport::new(
                D::DIALECT,
                &self.timer,
                orders,
                (waiting, due),
                unvacuumed,
                zone,
                newest,
            ),
        })
    }

    /// The deadline is a time, or a number when `deadline_unit` says it
    /// counts since the epoch ([`shape::check_deadline_type`]); the type is
    /// the server's description of the expression, read without running it.
    async fn check_deadline_type(&self) -> Result<DeadlineKind, StoreError> {
        let t = &self.timer;
        let query = format!(
            "SELECT {} FROM {} AS o WHERE 1 = 0",
            shape::raw_deadline_sql(D::DIALECT, t),
            shape::quote(D::DIALECT, &t.table)
        );
        let type_name = self
            .result_type(query)
            .await
            .map_err(|e| match StoreError::Sql(e) {
                error if !error.is_permanent() => error,
                error => StoreError::Schema {
                    key: t.key(TimerKey::Deadline),
                    problem: t.problem(format!("{:?} does not evaluate: {error}", t.deadline)),
                },
            })?;
        shape::check_deadline_type(t, &type_name).map_err(|e| match e {
            StoreError::Schema { key, problem } => StoreError::Schema {
                key,
                problem: t.problem(problem),
            },
            other => other,
        })?;
        Ok(shape::deadline_kind(D::DIALECT, t, &type_name))
    }

    /// Which zone the deadline is read in, and why (`zones::decide`): the
    /// configured one, or the server's default for new sessions, unless
    /// the deadline is zone-less and the server's sessions disagree.
    async fn read_zone(&self, deadline: DeadlineKind) -> Result<ZoneReport, StoreError> {
        let facts = D::zone_facts(self).await?;
        zones::decide(self.timer.time_zone.as_deref(), deadline, &facts).map_err(|problem| {
            StoreError::Schema {
                key: self.timer.key(TimerKey::TimeZone),
                problem: self.timer.problem(problem),
            }
        })
    }

    /// The timer's status codes are different codes in the status column
    /// itself, not only as written: under a case-insensitive collation
    /// (MySQL's default) or in a `char(n)` column, `unpaid` and `UNPAID`
    /// are one code, and a flip from one to the other changes nothing.
    async fn check_codes_differ(&self, orders: &OrdersColumns) -> Result<(), StoreError> {
        let t = &self.timer;
        let mut pairs = vec![(TimerKey::To, &t.to, &t.from)];
        if let Some(paid) = &t.paid {
            pairs.push((TimerKey::Paid, paid, &t.from));
            pairs.push((TimerKey::Paid, paid, &t.to));
        }
        for (key, a, b) in pairs {
            if a.as_text() == b.as_text() {
                continue;
            }
            let same = D::same_code(self, orders, a, b)
                .await
                .map_err(|e| match e {
                    error if !error.is_permanent() => error,
                    error => StoreError::Schema {
                        key: t.key(key),
                        problem: format!(
                            "comparing {a} with {b} in the status column's type {} failed: {error}",
                            orders.status_type
                        ),
                    },
                })?;
            if same {
                return Err(StoreError::Schema {
                    key: t.key(key),
                    problem: format!(
                        "{a} and {b} are one code in the status column {:?} ({}: letter case \
                         or trailing spaces do not count in its comparison)",
                        t.status, orders.status_type
                    ),
                });
            }
        }
        Ok(())
    }

    /// The items table's order id column and its type without modifiers,
    /// from the table's `columns`.
    fn check_items(&self, columns: &Columns) -> Result<(IdColumn, String), StoreError> {
        let i = &self.timer.items;
        shape::check_items_identifiers(i)?;
        shape::check_items_columns(i, columns)
    }

    /// Evaluates the deadline and the guard over the rows in the timer's
    /// `from` status (the unpaid orders), so that
    /// a mistake in either is reported now, with its key, and not on the
    /// first order due. A failure waiting can fix (the connection, a lock
    /// or statement timeout) is not a mistake in the mapping and stays
    /// transient.
    async fn count_waiting(&self, mapped: &Mapped) -> Result<(i64, i64, Option<i64>), StoreError> {
        self.count_rows(mapped).await.map_err(|error| {
            if !error.is_permanent() {
                return error;
            }
            StoreError::Schema {
                key: self.timer.key(TimerKey::DeadlineGuard),
                problem: format!(
                    "evaluating them over the rows in status {} failed: {error}",
                    self.timer.from
                ),
            }
        })
    }

    /// Prepares the rendered statements and the `also` statements (a
    /// mistake is reported with its key), returning how each `also`
    /// statement is bound the order id. A rendered statement must take
    /// exactly the parameters the service binds. A failure waiting can fix
    /// (the connection) stays transient.
    async fn check_statements(&self, mapped: &Mapped) -> Result<Vec<D::AlsoParams>, StoreError> {
        let prepare = async |check: &Check| {
            let found = (self.parameters(&check.sql).await)
                .map_err(|e| statement_error(check.key, &check.sql, e))?;
            if found != check.binds {
                return Err(StoreError::Schema {
                    key: check.key,
                    problem: format!(
                        "the statement takes {found} parameters where the service binds {}: \
                         the guard, the deadline and the `set` values take none \
                         (no `$1` or `?` in them): {}",
                        check.binds, check.sql
                    ),
                });
            }
            Ok(())
        };
        let items = self.timer.release == Release::Grpc;
        let shop = shop::checks::<D>(&self.timer, mapped, items);
        // The flip first: a placeholder in the guard is named by its key.
        let mut checks = shop.into_iter();
        if let Some(check) = checks.next() {
            prepare(&check).await?;
        }
        let key = self.timer.key(TimerKey::Also);
        let mut also_params = Vec::new();
        for statement in &self.timer.also {
            also_params.push(self.check_takes_the_id(key, statement).await?.0);
        }
        for check in checks {
            prepare(&check).await?;
        }
        Ok(also_params)
    }

    /// Prepares a statement the operator wrote (an `also` statement, the
    /// `also_keys` query) whose only parameter is the order id, returning
    /// how the id is bound to it, and the statement as the server described
    /// it; a mistake names `key`.
    async fn check_takes_the_id(
        &self,
        key: &'static str,
        statement: &str,
    ) -> Result<(D::AlsoParams, <D::Db as sqlx::Database>::Statement), StoreError> {
        let prepared = (D::prepare(self, statement.to_owned()).await)
            .map_err(|e| statement_error(key, statement, e))?;
        match D::also_parameters(&prepared) {
            Ok(params) => Ok((params, prepared)),
            Err(problem) => Err(StoreError::Schema {
                key,
                problem: format!("{problem}: {statement}"),
            }),
        }
    }

    /// The `also_keys` query, when there is one: it takes the order id and
    /// returns keys the cancel transaction can read as text (on MySQL, a
    /// text or integer column; PostgreSQL casts whatever it returns).
    async fn check_also_keys(&self) -> Result<Option<D::AlsoParams>, StoreError> {
        let query = self.timer.also_keys.trim();
        if query.is_empty() {
            return Ok(None);
        }
        let key = self.timer.key(TimerKey::AlsoKeys);
        let (params, prepared) = self.check_takes_the_id(key, query).await?;
        let ty = first_column_type(&prepared);
        let readable = ["CHAR", "TEXT", "INT", "ENUM"]
            .iter()
            .any(|kind| ty.to_ascii_uppercase().contains(kind));
        if ty.is_empty() || (D::DIALECT == Dialect::MySql && !readable) {
            return Err(StoreError::Schema {
                key,
                problem: format!(
                    "returns a first column of type {ty:?}: return the keys as text or \
                     integers (CAST(… AS CHAR)): {query}"
                ),
            });
        }
        Ok(Some(params))
    }
}

/// A statement of the mapping (`key`) that the server would not prepare: a
/// mistake of the mapping when permanent, else transient (the connection;
/// waiting can fix it).
fn statement_error(key: &'static str, statement: &str, e: sqlx::Error) -> StoreError {
    match StoreError::Sql(e) {
        error if !error.is_permanent() => error,
        error => StoreError::Schema {
            key,
            problem: format!("{error}: {statement}"),
        },
    }
}
