//! A tiny spin lock for the shim's in-process tables. Unlike `std::sync::Mutex` it can be
//! taken by a `pthread_atfork` prepare handler and force-released in the child, so a `fork`
//! while another thread holds it cannot leave the child with a lock nobody will release.
//! Critical sections are a hash-map operation long.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked` (acquire on lock, release on unlock).
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SpinLock<T> {}

pub struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    pub fn lock(&self) -> Guard<'_, T> {
        self.acquire();
        Guard { lock: self }
    }

    /// Take the lock without a guard (for the fork handlers); pair with [`Self::force_unlock`].
    pub fn acquire(&self) {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Release a lock taken by [`Self::acquire`], or (in a fork child) by a thread that no
    /// longer exists.
    ///
    /// # Safety
    /// No guard of this lock may be alive in the calling thread's process.
    pub unsafe fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// The value, while the caller holds the lock through [`Self::acquire`].
    ///
    /// # Safety
    /// The caller holds the lock (no guard exists).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn get_locked(&self) -> &mut T {
        // SAFETY: exclusive by the caller's contract.
        unsafe { &mut *self.value.get() }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves the lock is held, exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}
