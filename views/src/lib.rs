//! kvgpt's views over the core, for learners and for measuring: what `kvgpt inspect`, `explain`,
//! `verify`, `score`, `info`, `bench` and `cache diff` compute, and the pictures they draw
//! (terminal heatmaps, SVG, self-contained HTML viewers). The `kvgpt` binary and the Python
//! package both draw from here; nothing here parses arguments or serves HTTP.

#![forbid(unsafe_code)]

// What the model computes, recorded and laid out for reading.
pub mod inspect;
pub mod score;

// Checks and measurements.
pub mod bench;
pub mod info;
pub mod verify;

// A conversation, turn by turn.
pub mod chat;

// The prompt cache, replayed offline.
pub mod cache_replay;

// Pictures.
pub mod render;
