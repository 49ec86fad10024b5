//! Every statement template of the service, on both dialects: the
//! statements of its own tables (`src/store/outbox.rs`), of the shop's
//! (`src/store/shop.rs`) and of the cancel transaction
//! (`src/store/cancel.rs`), rendered for the default timer on the test
//! shop's tables and prepared by the database, each taking exactly the
//! parameters the service binds. Which templates there are is not a list
//! kept here: the store's unit tests find every template constant in those
//! files' sources and check it is in the list this test prepares.

use order_timeout::testing::store::{ShopSchema, connect_lazy};

use crate::common::{Dialect, TestEnv, on_both_dialects};

async fn every_template_prepares_with_the_parameters_the_service_binds(dialect: Dialect) {
    let env = TestEnv::on(dialect).await;
    let store = connect_lazy(&env.settings.database_url, 2, &ShopSchema::default()).unwrap();
    let prepared = store
        .prepare_every_template()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // 35 of the service's own tables (two of them the other dialect's
    // variants, left out), 13 of the shop's and 8 of the cancel
    // transaction.
    assert_eq!(prepared, 56, "templates prepared on {dialect:?}");
}

on_both_dialects!(every_template_prepares_with_the_parameters_the_service_binds);
