//! The test matrix: a case is written once, as an `async fn`, and
//! [`matrix!`] instantiates it as one test per cell, a cell being a
//! dialect of the shop's orders (PostgreSQL or MariaDB) on a broker (the
//! machine's RabbitMQ 3.10 or the RabbitMQ 4.x test node), each cell's
//! tests in a module of its own: `SUITE::postgres::case`,
//! `SUITE::mariadb::case`, `SUITE::rabbitmq4::case`, so that
//! `cargo test --test e2e rabbitmq4::` picks one cell's tests.
//!
//! The suites name their cells through the front ends:
//! [`on_both_dialects!`](crate::common::on_both_dialects) (`postgres` and
//! `mariadb`), [`on_rabbitmq4!`](crate::common::on_rabbitmq4) (`rabbitmq4`:
//! PostgreSQL on RabbitMQ 4.x) and
//! [`on_both_brokers!`](crate::common::on_both_brokers) (`rabbitmq3` and
//! `rabbitmq4`, the case taking the [`Broker`](crate::common::Broker));
//! a suite whose modules have other names (the store suite's and the
//! timers' `mysql`) calls [`matrix!`] itself.
//!
//! A test on RabbitMQ 4.x runs only when the node runs
//! ([`Broker::available`](crate::common::Broker::available), asked of 4.x
//! cells only); every test runs inside its broker's
//! [`Broker::scope`](crate::common::Broker::scope).

use std::future::Future;

use super::Broker;

/// Runs one cell's test `body` on `broker`: inside its scope, or (RabbitMQ
/// 4.x not running and not required) not at all. Only a 4.x cell asks
/// whether its node runs (the first question runs `scripts/rabbitmq4.sh
/// status`).
pub async fn run<F: Future<Output = ()>>(broker: Broker, body: F) {
    if broker == Broker::Rabbitmq3 || broker.available() {
        broker.scope(body).await;
    }
}

/// Instantiates each case as one test per cell:
///
/// ```text
/// matrix! {
///     pass: dialect,                 // the case's argument: `dialect`
///                                    // (a `Dialect`), `broker` (a
///                                    // `Broker`) or `fixture` (a
///                                    // `&Fixture` of the suite's, made
///                                    // by `Fixture::new(dialect)`)
///     cells: [postgres(Postgres, Rabbitmq3), mariadb(MySql, Rabbitmq3)],
///     cases: [
///         a_case,                    // `super::a_case`
///         #[mariadb(ignore = "why")] // an attribute of the MariaDB
///         another_case,              // tests only (a known bug, reported)
///         in group { third_case },   // `super::group::third_case`
///         in a::b { fourth_case },   // `super::a::b::fourth_case`
///         in group with [tokio::test] { fifth_case }, // another runtime
///     ],
/// }
/// ```
///
/// Every test runs on a two-thread runtime unless its group names another
/// test attribute.
macro_rules! matrix {
    (
        pass: $pass:ident,
        cells: [$($module:ident($dialect:ident, $broker:ident)),+ $(,)?],
        cases: $cases:tt $(,)?
    ) => {
        $(
            #[doc = concat!("The suite's tests on ", stringify!($dialect), " and ", stringify!($broker), ".")]
            mod $module {
                $crate::common::matrix!(@cases ($pass $dialect $broker)
                    [tokio::test(flavor = "multi_thread", worker_threads = 2)] [] $cases);
            }
        )+
    };
    // The cases, one at a time.
    (@cases $cell:tt $test:tt $group:tt []) => {};
    (@cases $cell:tt $test:tt $group:tt [, $($rest:tt)*]) => {
        $crate::common::matrix!(@cases $cell $test $group [$($rest)*]);
    };
    (@cases $cell:tt $test:tt [] [in $($group:ident)::+ with $inner:tt { $($cases:tt)* } $($rest:tt)*]) => {
        $crate::common::matrix!(@cases $cell $inner [$($group)+] [$($cases)*]);
        $crate::common::matrix!(@cases $cell $test [] [$($rest)*]);
    };
    (@cases $cell:tt $test:tt [] [in $($group:ident)::+ { $($cases:tt)* } $($rest:tt)*]) => {
        $crate::common::matrix!(@cases $cell $test [$($group)+] [$($cases)*]);
        $crate::common::matrix!(@cases $cell $test [] [$($rest)*]);
    };
    (@cases $cell:tt $test:tt $group:tt [$(#[$which:ident $attr:tt])* $name:ident $($rest:tt)*]) => {
        $crate::common::matrix!(@attrs $cell $test $group $name [] $($which $attr)*);
        $crate::common::matrix!(@cases $cell $test $group [$($rest)*]);
    };
    // A case's attributes: those of its cell's dialect kept.
    (@attrs ($pass:ident MySql $broker:ident) $test:tt $group:tt $name:ident [$($kept:tt)*]
        mariadb ($($attr:tt)*) $($rest:tt)*) => {
        $crate::common::matrix!(@attrs ($pass MySql $broker) $test $group $name
            [$($kept)* [$($attr)*]] $($rest)*);
    };
    (@attrs $cell:tt $test:tt $group:tt $name:ident $kept:tt $which:ident $attr:tt $($rest:tt)*) => {
        $crate::common::matrix!(@attrs $cell $test $group $name $kept $($rest)*);
    };
    (@attrs ($pass:ident $dialect:ident $broker:ident) $test:tt [$($group:ident)*] $name:ident [$($kept:tt)*]) => {
        $(#$kept)*
        #$test
        async fn $name() {
            $crate::common::matrix::run(
                $crate::common::Broker::$broker,
                $crate::common::matrix!(@body $pass $dialect $broker super::$($group::)*$name),
            )
            .await;
        }
    };
    // What the case is called with.
    (@body dialect $dialect:ident $broker:ident $($case:tt)*) => {
        $($case)*($crate::common::Dialect::$dialect)
    };
    (@body broker $dialect:ident $broker:ident $($case:tt)*) => {
        $($case)*($crate::common::Broker::$broker)
    };
    (@body fixture $dialect:ident $broker:ident $($case:tt)*) => {
        async {
            let fixture = super::Fixture::new($crate::common::Dialect::$dialect).await;
            $($case)*(&fixture).await;
        }
    };
}
pub(crate) use matrix;

/// Instantiates each listed case, `async fn name(dialect: Dialect)`, as
/// two tests of the suite: `postgres::name` (the shop's orders on
/// PostgreSQL) and `mariadb::name` (on MariaDB), so that a suite states
/// once which of its tests run on both dialects, and `cargo test
/// SUITE::mariadb::` picks one dialect's. `#[mariadb(ignore = "why")]`
/// before a name ignores its MariaDB test only (a known bug, reported).
macro_rules! on_both_dialects {
    ($($cases:tt)*) => {
        $crate::common::matrix! {
            pass: dialect,
            cells: [postgres(Postgres, Rabbitmq3), mariadb(MySql, Rabbitmq3)],
            cases: [$($cases)*],
        }
    };
}
pub(crate) use on_both_dialects;

/// Instantiates each listed case, `async fn name(dialect: Dialect)` (the
/// shape [`on_both_dialects!`] takes), once more as `rabbitmq4::name`: the
/// shop's orders on PostgreSQL, the test's vhost on the RabbitMQ 4.x test
/// node. The same case's `postgres::name` runs it on the machine's broker,
/// so a suite states which of its tests must behave the same on both, and
/// `cargo test --test e2e rabbitmq4::` runs every 4.x test.
macro_rules! on_rabbitmq4 {
    ($($cases:tt)*) => {
        $crate::common::matrix! {
            pass: dialect,
            cells: [rabbitmq4(Postgres, Rabbitmq4)],
            cases: [$($cases)*],
        }
    };
}
pub(crate) use on_rabbitmq4;

/// Instantiates each listed case, `async fn name(broker: Broker)`, as two
/// tests: `rabbitmq3::name` (the machine's RabbitMQ) and `rabbitmq4::name`
/// (RabbitMQ 4.x), each run inside its [`Broker::scope`].
macro_rules! on_both_brokers {
    ($($cases:tt)*) => {
        $crate::common::matrix! {
            pass: broker,
            cells: [rabbitmq3(Postgres, Rabbitmq3), rabbitmq4(Postgres, Rabbitmq4)],
            cases: [$($cases)*],
        }
    };
}
pub(crate) use on_both_brokers;
