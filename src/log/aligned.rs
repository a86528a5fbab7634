//! Heap buffers aligned for O_DIRECT I/O: the writer's batches and the zeros of spare
//! segments.

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::ptr::NonNull;

/// The O_DIRECT alignment of buffers, offsets and lengths, in bytes.
pub(crate) const BLOCK: usize = 4096;

/// A heap buffer aligned to [`BLOCK`] whose capacity is a multiple of it, for O_DIRECT writes.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the bytes (`as_slice`); mutation needs `&mut self`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// An empty buffer holding at least `cap` bytes.
    pub(crate) fn with_capacity(cap: usize) -> AlignedBuf {
        let cap = cap.max(BLOCK).next_multiple_of(BLOCK);
        let layout = Layout::from_size_align(cap, BLOCK).expect("a block-aligned layout");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf { ptr, cap, len: 0 }
    }

    /// `len` zero bytes (`len` a multiple of [`BLOCK`]).
    pub(crate) fn zeroed(len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::with_capacity(len);
        // The allocation is zeroed.
        b.len = len;
        b
    }

    /// Bytes the allocation can hold.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes held.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len <= cap` bytes from `ptr` are initialised (allocated zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Empties the buffer, keeping its allocation.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    fn reserve(&mut self, extra: usize) {
        let need = self.len + extra;
        if need <= self.cap {
            return;
        }
        let mut grown = AlignedBuf::with_capacity(need.max(self.cap * 2));
        grown.extend_from_slice(self.as_slice());
        *self = grown;
    }

    /// Appends `bytes`, growing the allocation when needed.
    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        // SAFETY: `reserve` made room for `bytes.len()` more bytes; the regions are distinct
        // allocations.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(self.len), bytes.len()) };
        self.len += bytes.len();
    }

    /// Shortens the buffer to `len` bytes (no-op when already shorter).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Zero-fills up to the next multiple of [`BLOCK`].
    pub(crate) fn pad_to_block(&mut self) {
        let to = self.len.next_multiple_of(BLOCK);
        self.reserve(to - self.len);
        // SAFETY: `reserve` made room; the bytes are initialised (allocated zeroed, and
        // possibly reused, so they are overwritten here).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, to - self.len) };
        self.len = to;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, BLOCK).expect("a block-aligned layout");
        // SAFETY: allocated in `with_capacity` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) };
    }
}
