//! The store contract through the bare-client executor written in the tests,
//! proving that the `PgExecutor` seam is open to other drivers.
waymark_testing::store_contract!(waymark_tests::client_store, schema = waymark_tests::TestSchema);
