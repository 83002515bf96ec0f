//! The store contract through the built-in bb8 pool.
waymark_tests::store_contract!(waymark_tests::pool_store);
