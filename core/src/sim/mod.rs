//! The deterministic simulated memory (being written).
