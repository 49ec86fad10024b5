//! Every test has a bound: a hang becomes a failure that names the test
//! and the step it was at, never a CI run that stops at its time limit
//! with nothing said.
//!
//! - [`Watchdog`]: started by every test's environment ([`crate::common::TestEnv`],
//!   the store fixtures), it ends the test process with the test's name
//!   and last [`step`] when the test has not ended within [`TEST_LIMIT`].
//!   Libtest cannot fail one hanging test alone; ending the run with the
//!   name is the next best thing, and far better than hanging.
//! - [`output_within`]: an external command (`rabbitmqctl`, `promtool`,
//!   the service's binary, …) killed and failed, with its name, when it
//!   outlives its limit.
//! - [`step`]: what a test is waiting for now, for the watchdog's message
//!   (`TestEnv::eventually` records its `what`).

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest a test may run: several times the slowest test's time on
/// a loaded 2-core machine.
pub const TEST_LIMIT: Duration = Duration::from_secs(10 * 60);

/// The last step each running test (by its thread's name) reached.
static STEPS: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// The name libtest gives the current test's thread.
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("an unnamed test")
        .to_owned()
}

/// Records `what` as the step the current test is at.
pub fn step(what: &str) {
    let mut steps = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    steps
        .get_or_insert_with(HashMap::new)
        .insert(test_name(), what.to_owned());
}

fn last_step(test: &str) -> String {
    let steps = STEPS.lock().unwrap_or_else(|e| e.into_inner());
    steps
        .as_ref()
        .and_then(|s| s.get(test).cloned())
        .unwrap_or_else(|| "setting up".into())
}

/// Ends the process, naming the test and its last step, if the test that
/// started it is still running after its limit. Stopped when dropped (the
/// environment holding it goes away with the test).
#[derive(Debug)]
pub struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    /// A watchdog over the current test, for [`TEST_LIMIT`].
    pub fn start() -> Self {
        Self::with_limit(TEST_LIMIT)
    }

    /// A watchdog over the current test, for `limit`.
    pub fn with_limit(limit: Duration) -> Self {
        let test = test_name();
        let done = Arc::new(AtomicBool::new(false));
        let over = done.clone();
        std::thread::Builder::new()
            .name(format!("watchdog {test}"))
            .spawn(move || {
                let end = Instant::now() + limit;
                while Instant::now() < end {
                    if over.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                if !over.load(Ordering::Relaxed) {
                    eprintln!(
                        "\nTIMED OUT: test {test} did not end within {limit:?}; its last step: {}\n",
                        last_step(&test)
                    );
                    std::process::exit(124);
                }
            })
            .expect("start the watchdog thread");
        Self { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// A child process killed (SIGKILL) and reaped when dropped, so that a
/// test that fails halfway leaves no `serve` running behind it (one kept
/// the test run's output pipe open, and the run with it).
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    /// Kills it now (`kill -9`), and waits for it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `command` to its end, with its output captured, for at most
/// `limit`: past it the command is killed and the test fails, naming
/// `what`. (A command that cannot start fails the test too.)
pub fn output_within(command: &mut Command, limit: Duration, what: &str) -> Output {
    output_with_input(command.stdin(Stdio::null()), None, limit, what)
}

/// [`output_within`] with `input` written to the command's standard input
/// (`None`: the standard input the command has).
pub fn output_with_input(
    command: &mut Command,
    input: Option<&[u8]>,
    limit: Duration,
    what: &str,
) -> Output {
    if input.is_some() {
        command.stdin(Stdio::piped());
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        // A command that does not read its input closes the pipe: fine.
        let _ = stdin.write_all(input);
    }
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(limit) {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{what}: no answer within {limit:?}; killed (pid {pid})")
        }
    }
}

#[test]
fn a_command_past_its_limit_is_killed_and_named() {
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(|| {
        output_within(
            Command::new("sleep").arg("30"),
            Duration::from_millis(300),
            "sleeping",
        )
    });
    let message = outcome
        .err()
        .and_then(|e| e.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(
        message.starts_with("sleeping: no answer within 300ms; killed"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let done = output_within(&mut Command::new("true"), Duration::from_secs(5), "true");
    assert!(done.status.success());
}

/// Run only by [`the_watchdog_ends_a_hanging_test_naming_it_and_its_step`],
/// in a process of its own: hangs under a short watchdog.
#[test]
#[ignore = "hangs on purpose; run by the_watchdog_ends_a_hanging_test_naming_it_and_its_step"]
fn hangs_for_the_watchdog() {
    let _watchdog = Watchdog::with_limit(Duration::from_millis(500));
    step("waiting for something that never comes");
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn the_watchdog_ends_a_hanging_test_naming_it_and_its_step() {
    let exe = std::env::current_exe().expect("the test binary");
    let out = output_within(
        Command::new(exe).args([
            "--exact",
            "bounds::hangs_for_the_watchdog",
            "--ignored",
            "--nocapture",
        ]),
        Duration::from_secs(30),
        "the hanging test",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(
        stderr.contains(
            "TIMED OUT: test bounds::hangs_for_the_watchdog did not end within 500ms; \
             its last step: waiting for something that never comes"
        ),
        "{stderr}"
    );
}
