//! CPU time of the calling thread, the process or its children: wall time means little on a
//! machine shared with builds.

use std::time::Duration;

/// CPU time the calling thread has used so far.
pub fn thread_cpu() -> Duration {
    cpu_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of `clock` (a thread's or the whole process's CPU-time clock).
pub fn cpu_time(clock: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock ids passed are constants Linux knows.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({clock}) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// CPU time (user and system) of every child process waited for so far.
#[allow(dead_code)] // Only the programs that spawn what they measure use it.
pub fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time (user and system, every thread) and minor page faults of process `pid` so far,
/// from `/proc/PID/stat`; zero where it cannot be read.
#[allow(dead_code)] // Only the programs that watch another process use it.
pub fn process_cpu_and_faults(pid: u32) -> (Duration, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name: `[0]` is the state, `[7]` minor faults, `[11]` and `[12]`
    // user and system CPU ticks.
    let after_command = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = (after_command.split_whitespace())
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    // SAFETY: sysconf reads a constant of the running system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpu = Duration::from_secs_f64((field(11) + field(12)) as f64 / per_second);
    (cpu, field(7))
}
