//! The arrays the programs share with userspace, read through a memory mapping: no map syscall
//! runs while tracing. Those syscalls hold the CPU's BPF recursion guard while preemptible, and
//! a kprobe that fires on that CPU meanwhile is lost.

use std::{
    marker::PhantomData,
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::{anyhow, bail, Result};
use aya::maps::Map;

/// A read-only mapping of a `BPF_F_MMAPABLE` array map of `T`.
pub struct Shared<T> {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes per element (the value size rounded up to 8, as the kernel lays them out).
    stride: usize,
    entries: usize,
    _t: PhantomData<T>,
}

// SAFETY: the mapping is plain shared memory; reads are copies of plain integer structs.
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as above; the mapping is read-only.
unsafe impl<T> Sync for Shared<T> {}

impl<T: Copy> Shared<T> {
    /// Maps `map`, which must be an array of `entries` values of `T` created with
    /// `BPF_F_MMAPABLE`.
    pub fn new(name: &str, map: &Map, entries: usize) -> Result<Self> {
        let Map::Array(data) = map else {
            bail!("map {name} is not an array");
        };
        let fd = data.fd().as_fd().as_raw_fd();
        let (ptr, len, stride) = map_array(fd, std::mem::size_of::<T>(), entries)
            .map_err(|e| anyhow!("cannot map {name} into memory: {e}"))?;
        Ok(Shared {
            ptr,
            len,
            stride,
            entries,
            _t: PhantomData,
        })
    }

    /// Elements mapped.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// The first u64 of element `i` as it is now (a tag, say, read before the whole element).
    pub fn first_word(&self, i: usize) -> u64 {
        const { assert!(std::mem::size_of::<T>() >= 8) };
        self.word(i, 0)
    }

    /// The u64 at byte `offset` of element `i` as it is now (one atomic load): one field of
    /// the element, without copying the rest of it.
    pub fn word(&self, i: usize, offset: usize) -> u64 {
        assert!(
            i < self.entries,
            "index {i} beyond {} entries",
            self.entries
        );
        assert!(
            offset.is_multiple_of(8)
                && offset
                    .checked_add(8)
                    .is_some_and(|end| end <= std::mem::size_of::<T>()),
            "offset {offset} is not a whole u64 of the element"
        );
        const { assert!(std::mem::align_of::<T>() == 8) };

        // SAFETY: as in `get`: element i lies within the mapping, aligned to 8, and holds a
        // whole u64 at `offset` (checked above).
        unsafe {
            (*self
                .ptr
                .as_ptr()
                .add(i * self.stride + offset)
                .cast::<AtomicU64>())
            .load(Ordering::Relaxed)
        }
    }

    /// A copy of element `i` as it is now. The programs may be updating it: each u64 is read
    /// whole (an atomic load each, as the programs' atomic adds require of a reader), but the
    /// struct is not a consistent cut (a call's total can be in it without its self time);
    /// `HistData` takes that into account.
    pub fn get(&self, i: usize) -> T {
        assert!(
            i < self.entries,
            "index {i} beyond {} entries",
            self.entries
        );
        const { assert!(std::mem::size_of::<T>().is_multiple_of(8) && std::mem::align_of::<T>() == 8) };
        let mut out = std::mem::MaybeUninit::<T>::uninit();

        // SAFETY: the element lies within the mapping and is aligned to 8 (the stride is a
        // multiple of 8 and the mapping page-aligned); T is a plain struct of integers (the
        // programs' map values), aligned to 8 and a whole number of u64 (checked above), so
        // every bit pattern is a T and aligned u64 words fill it.
        unsafe {
            let from = self.ptr.as_ptr().add(i * self.stride).cast::<AtomicU64>();
            let to = out.as_mut_ptr().cast::<u64>();
            for w in 0..std::mem::size_of::<T>() / 8 {
                to.add(w).write((*from.add(w)).load(Ordering::Relaxed));
            }

            out.assume_init()
        }
    }
}

/// A read-only shared mapping of the mappable array map `fd` of `entries` values of
/// `value_size` bytes: (its start, its length, the bytes per element as the kernel lays them
/// out: the value size rounded up to 8). The caller unmaps it.
pub(super) fn map_array(
    fd: i32,
    value_size: usize,
    entries: usize,
) -> std::io::Result<(NonNull<u8>, usize, usize)> {
    let stride = value_size.next_multiple_of(8);

    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = (stride * entries).next_multiple_of(page);

    // SAFETY: a read-only shared mapping of a map fd; the kernel checks the length.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok((
        NonNull::new(addr.cast()).expect("mmap returned a pointer"),
        len,
        stride,
    ))
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // SAFETY: unmapping what new() mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
