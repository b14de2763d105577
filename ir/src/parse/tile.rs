//! Tile text.
