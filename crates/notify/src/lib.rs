//! LISTEN hubs leased from a bounded registry (work in progress).
