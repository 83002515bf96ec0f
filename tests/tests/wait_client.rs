//! Waiting for results through an executor with no listener: every wait
//! polls, and still answers rightly.
waymark_tests::wait_contract!(waymark_tests::client_store);
