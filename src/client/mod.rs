//! Native clients (in progress).
