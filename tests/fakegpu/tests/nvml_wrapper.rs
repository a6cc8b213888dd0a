//! (c) nvml-wrapper, which `dlopen`s "libnvidia-ml.so.1", reads the fake: identity, memory,
//! clocks, power and energy, utilization and processes, and (as root) changes clocks and the
//! power limit, which then shows in the clock and power readings.

mod common;

use common::{field, in_child, run_ok, Cuda, Fake};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::{DeviceArchitecture, GpuLockedClocksSetting, UsedGpuMemory};
use nvml_wrapper::Nvml;

const GIB: u64 = 1 << 30;

#[test]
fn nvml_wrapper_reads_and_controls_the_fake() {
    if in_child() {
        // Hold 3 GiB and keep the device busy through the CUDA half first.
        let cuda = Cuda::load();
        assert_eq!(cuda.init(), 0);
        cuda.ctx_create(0).unwrap();
        cuda.alloc(3 * GIB as usize).unwrap();

        let nvml = Nvml::init().expect("Nvml::init loads libnvidia-ml.so.1");
        assert_eq!(nvml.device_count().unwrap(), 1);
        assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12080);
        assert!(!nvml.sys_driver_version().unwrap().is_empty());
        let mut device = nvml.device_by_index(0).unwrap();
        assert_eq!(device.name().unwrap(), "NVIDIA H100 80GB HBM3");
        let uuid = device.uuid().unwrap();
        assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
        assert_eq!(
            nvml.device_by_uuid(uuid.as_str()).unwrap().index().unwrap(),
            0
        );
        let pci = device.pci_info().unwrap();
        assert_eq!(
            nvml.device_by_pci_bus_id(pci.bus_id.as_str())
                .unwrap()
                .index()
                .unwrap(),
            0
        );

        let memory = device.memory_info().unwrap();
        assert_eq!(
            (memory.total, memory.used, memory.free),
            (80 * GIB, 3 * GIB, 77 * GIB)
        );
        let processes = device.running_compute_processes().unwrap();
        let me = processes
            .iter()
            .find(|p| p.pid == std::process::id())
            .expect("this process is listed");
        assert!(matches!(me.used_gpu_memory, UsedGpuMemory::Used(b) if b == 3 * GIB));

        assert_eq!(device.architecture().unwrap(), DeviceArchitecture::Hopper);
        let cc = device.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), (9, 0));
        assert_eq!(device.num_cores().unwrap(), 132 * 128);
        assert_eq!(device.max_clock_info(Clock::Graphics).unwrap(), 1980);
        assert_eq!(device.max_clock_info(Clock::Memory).unwrap(), 2619);
        assert_eq!(device.supported_memory_clocks().unwrap(), vec![2619]);
        let clocks = device.supported_graphics_clocks(2619).unwrap();
        assert_eq!(
            (clocks.len(), clocks[0], clocks[clocks.len() - 1]),
            (110, 1980, 345)
        );
        assert_eq!(
            device.clock_info(Clock::SM).unwrap(),
            345,
            "idle: the lowest clock"
        );
        assert_eq!(device.power_usage().unwrap(), 70_000, "idle power");
        let limits = device.power_management_limit_constraints().unwrap();
        assert_eq!((limits.min_limit, limits.max_limit), (200_000, 700_000));
        assert_eq!(device.power_management_limit_default().unwrap(), 700_000);

        // Busy: full clock, full power, utilization.
        let f = cuda.function();
        for _ in 0..30 {
            assert_eq!(cuda.launch(f, 132 * 100), 0); // 10 ms each at full clock
        }
        let energy_before = device.total_energy_consumption().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(device.clock_info(Clock::SM).unwrap(), 1980);
        let busy_power = device.power_usage().unwrap();
        assert!(busy_power > 70_000, "busy power {busy_power}");
        assert!(device.utilization_rates().unwrap().gpu > 0);
        assert!(
            device.total_energy_consumption().unwrap() > energy_before,
            "energy accumulates"
        );
        let samples = device.process_utilization_stats(None).unwrap();
        assert!(samples
            .iter()
            .any(|s| s.pid == std::process::id() && s.sm_util > 0));
        assert!(device.temperature(TemperatureSensor::Gpu).unwrap() > 30);

        // Root may lock clocks and cap power; both show while busy (kept busy on purpose, so
        // that a slow machine cannot let the one-second utilization window run out).
        let keep_busy = || assert_eq!(cuda.launch(f, 132 * 100), 0);
        device
            .set_gpu_locked_clocks(GpuLockedClocksSetting::Numeric {
                min_clock_mhz: 1200,
                max_clock_mhz: 1200,
            })
            .unwrap();
        keep_busy();
        assert_eq!(device.clock_info(Clock::SM).unwrap(), 1200);
        let locked_power = device.power_usage().unwrap();
        assert!(locked_power < busy_power, "{locked_power} < {busy_power}");
        device.reset_gpu_locked_clocks().unwrap();
        device.set_power_management_limit(300_000).unwrap();
        assert_eq!(device.power_management_limit().unwrap(), 300_000);
        assert_eq!(device.enforced_power_limit().unwrap(), 300_000);
        keep_busy();
        assert!(device.power_usage().unwrap() <= 300_000);
        assert!(
            device.clock_info(Clock::SM).unwrap() < 1980,
            "the power cap lowers the clock"
        );
        assert!(
            device.set_power_management_limit(100_000).is_err(),
            "below the minimum"
        );
        println!("uuid={uuid}");
        return;
    }
    let fake = Fake::new();
    let out = run_ok(&mut fake.rerun("nvml_wrapper_reads_and_controls_the_fake"));
    let state = &fake.states()[0];
    assert_eq!(field(&out, "uuid"), fake.config().devices[0].uuid);
    // Settings persist in the shared state for every process.
    assert_eq!(state.power_limit_mw(), Some(300_000));
    assert_eq!(state.locked_clocks(), None);
    assert_eq!(state.used(), 0);
}
