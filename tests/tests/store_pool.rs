//! The store contract through the built-in bb8 pool.
waymark_testing::store_contract!(waymark_tests::pool_store, schema = waymark_tests::TestSchema);
