//! Protocol v1 messages, framing and conversions (in progress).
