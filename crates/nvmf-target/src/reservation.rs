//! NVMe reservations (integrated from the reservations work).
