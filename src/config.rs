//! Server settings (in progress).
