//! The simulated NVIDIA driver.
