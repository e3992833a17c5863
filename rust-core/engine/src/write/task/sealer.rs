//! Background sealing: a task's complete shard files are synced and renamed into place by one
//! thread per [`TaskWriter`](super::TaskWriter) while the task goes on writing the next shard.
//!
//! * The task thread writes a shard to its temporary sibling, flushes it
//!   ([`FileWriter::close`](safetensors_spark_format::file::FileWriter::close)) and hands the [`PendingFile`] with
//!   the shard's report to [`Sealer::submit`]. The sealer thread commits the files one at a time,
//!   in order ([`PendingFile::commit`]: `fsync`, then rename onto the final name), and sends back
//!   each outcome.
//! * A shard is reported (returned by [`Sealer::take_ready`] / [`Sealer::finish`]) only once it
//!   is in place under its final name; a failure is kept and returned, as
//!   [`WriteError::Seal`] naming the shard and the path, by the next call on the sealer.
//! * At most [`QUEUED`] shards wait for the thread: sealing one more blocks the task until the
//!   thread takes one (bounded open files and unsynced data).
//! * [`Sealer::cancel`] stops the thread: the shards it has not committed yet are deleted
//!   without being synced (a commit already under way completes). [`Sealer::finish`] and
//!   dropping the sealer let the thread commit what is queued. Each of them joins the thread:
//!   it never outlives the sealer.
//! * If the thread cannot be started, shards are committed on the task's thread.

use super::WriteError;
use crate::write::ShardReport;
use safetensors_spark_format::error::FormatError;
use safetensors_spark_format::file::PendingFile;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// Shards handed over and not yet taken by the thread, at most.
pub(super) const QUEUED: usize = 2;

struct Job {
    file: PendingFile,
    report: ShardReport,
}

struct Outcome {
    result: Result<(), FormatError>,
    report: ShardReport,
}

#[derive(Default)]
struct Flags {
    cancel: bool,
    /// Tests only: the thread waits before each commit while set.
    paused: bool,
}

/// Flags shared with the thread.
#[derive(Default)]
struct Control {
    flags: Mutex<Flags>,
    changed: Condvar,
}

impl Control {
    fn lock(&self) -> MutexGuard<'_, Flags> {
        self.flags.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, f: impl FnOnce(&mut Flags)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits while paused; `false` once cancelled.
    fn proceed(&self) -> bool {
        let mut flags = self.lock();
        while flags.paused && !flags.cancel {
            flags = self
                .changed
                .wait(flags)
                .unwrap_or_else(PoisonError::into_inner);
        }
        !flags.cancel
    }
}

struct Worker {
    /// `None` once closed (the thread then ends after the queued jobs).
    jobs: Option<SyncSender<Job>>,
    outcomes: Receiver<Outcome>,
    thread: Option<JoinHandle<()>>,
}

fn run(jobs: Receiver<Job>, outcomes: Sender<Outcome>, control: Arc<Control>) {
    for Job { file, report } in jobs {
        let result = if control.proceed() {
            file.commit()
        } else {
            let dest = file.dest().to_path_buf();
            drop(file); // deletes the temporary file
            Err(FormatError::io(
                dest,
                std::io::Error::other("cancelled before it was synced"),
            ))
        };
        // Nobody listens any more only while the sealer is being dropped: go on with the queue.
        let _ = outcomes.send(Outcome { result, report });
    }
}

/// The sealer of one task writer (module docs).
pub(super) struct Sealer {
    thread_name: String,
    /// For errors that concern no single shard.
    work_dir: PathBuf,
    control: Arc<Control>,
    /// Started with the first shard.
    worker: Option<Worker>,
    /// Shards handed to the thread whose outcome has not been received.
    in_flight: usize,
    /// Shards in place, not reported yet.
    ready: Vec<ShardReport>,
    /// The first failure received, not reported yet.
    error: Option<WriteError>,
}

impl Sealer {
    pub(super) fn new(partition: u32, work_dir: &Path) -> Self {
        Sealer {
            thread_name: format!("st-seal-{partition}"),
            work_dir: work_dir.to_path_buf(),
            control: Arc::default(),
            worker: None,
            in_flight: 0,
            ready: Vec::new(),
            error: None,
        }
    }

    fn stopped(&self) -> WriteError {
        WriteError::io(
            &self.work_dir,
            std::io::Error::other(format!(
                "the shard sealing thread '{}' stopped unexpectedly",
                self.thread_name
            )),
        )
    }

    fn spawn(&self) -> Option<Worker> {
        let (jobs, job_rx) = mpsc::sync_channel(QUEUED);
        let (outcome_tx, outcomes) = mpsc::channel();
        let control = Arc::clone(&self.control);
        let thread = std::thread::Builder::new()
            .name(self.thread_name.clone())
            .spawn(move || run(job_rx, outcome_tx, control))
            .ok()?;
        Some(Worker {
            jobs: Some(jobs),
            outcomes,
            thread: Some(thread),
        })
    }

    fn record(&mut self, outcome: Outcome) {
        match outcome.result {
            Ok(()) => self.ready.push(outcome.report),
            Err(source) => {
                if self.error.is_none() {
                    self.error = Some(WriteError::Seal {
                        file: outcome.report.file,
                        source,
                    });
                }
            }
        }
    }

    /// Receives the outcomes that arrived (all outstanding ones if `block`).
    fn collect(&mut self, block: bool) {
        while self.in_flight > 0 {
            let Some(worker) = &self.worker else {
                self.in_flight = 0;
                return;
            };
            let received = if block {
                worker.outcomes.recv().ok()
            } else {
                match worker.outcomes.try_recv() {
                    Ok(outcome) => Some(outcome),
                    Err(TryRecvError::Empty) => return,
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            match received {
                Some(outcome) => {
                    self.in_flight -= 1;
                    self.record(outcome);
                }
                None => {
                    // The thread ended without answering (it panicked): the files it held
                    // were dropped, i.e. deleted.
                    self.in_flight = 0;
                    if self.error.is_none() {
                        self.error = Some(self.stopped());
                    }
                }
            }
        }
    }

    fn check(&mut self) -> Result<(), WriteError> {
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Hands a complete shard over to be synced and renamed into place; blocks while
    /// [`QUEUED`] shards wait. Returns an earlier shard's failure, if any (the new shard is then
    /// deleted).
    pub(super) fn submit(
        &mut self,
        file: PendingFile,
        report: ShardReport,
    ) -> Result<(), WriteError> {
        self.collect(false);
        self.check()?;
        if self.worker.is_none() {
            self.worker = self.spawn();
        }
        let Some(jobs) = self.worker.as_ref().and_then(|w| w.jobs.as_ref()) else {
            // No thread: commit here.
            return match file.commit() {
                Ok(()) => {
                    self.ready.push(report);
                    Ok(())
                }
                Err(source) => Err(WriteError::Seal {
                    file: report.file,
                    source,
                }),
            };
        };
        match jobs.send(Job { file, report }) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            // The thread is gone; dropping the returned job deletes its file.
            Err(_) => Err(self.stopped()),
        }
    }

    /// The shards put in place since the last call, in sealing order, or the first failure.
    pub(super) fn take_ready(&mut self) -> Result<Vec<ShardReport>, WriteError> {
        self.collect(false);
        self.check()?;
        Ok(std::mem::take(&mut self.ready))
    }

    /// Collects the shards put in place so far without handing them out; returns the first
    /// failure.
    pub(super) fn poll(&mut self) -> Result<(), WriteError> {
        self.collect(false);
        self.check()
    }

    /// Waits until every shard handed over is in place (or failed); returns the first failure.
    /// The shards stay to be reported.
    pub(super) fn wait(&mut self) -> Result<(), WriteError> {
        self.collect(true);
        self.check()
    }

    /// Waits for every shard handed over and stops the thread. Returns the shards put in place
    /// and not reported yet, or the first failure.
    pub(super) fn finish(&mut self) -> Result<Vec<ShardReport>, WriteError> {
        self.wait()?;
        self.shutdown()?;
        Ok(std::mem::take(&mut self.ready))
    }

    /// Stops the thread: shards not committed yet are deleted unsynced; a commit under way
    /// completes (the caller deletes the shard files afterwards). Nothing is reported.
    pub(super) fn cancel(&mut self) {
        self.control.set(|f| f.cancel = true);
        let _ = self.shutdown();
        self.in_flight = 0;
        self.ready.clear();
        self.error = None;
    }

    /// Closes the queue and joins the thread (which first works through what is queued).
    fn shutdown(&mut self) -> Result<(), WriteError> {
        let Some(mut worker) = self.worker.take() else {
            return Ok(());
        };
        drop(worker.jobs.take());
        let panicked = worker.thread.take().is_some_and(|t| t.join().is_err());
        // Outcomes of jobs still queued at the close (only when the caller did not wait).
        while let Ok(outcome) = worker.outcomes.try_recv() {
            self.in_flight = self.in_flight.saturating_sub(1);
            self.record(outcome);
        }
        if panicked {
            return Err(self.stopped());
        }
        Ok(())
    }

    /// Tests: holds the thread before each commit until [`Sealer::resume`] (or a cancel).
    #[cfg(test)]
    pub(super) fn pause(&self) {
        self.control.set(|f| f.paused = true);
    }

    #[cfg(test)]
    pub(super) fn resume(&self) {
        self.control.set(|f| f.paused = false);
    }

    /// Tests: waits for every outcome without reporting anything (a failure stays for the next
    /// call).
    #[cfg(test)]
    pub(super) fn settle(&mut self) {
        self.collect(true);
    }

    /// Tests: whether a thread is running.
    #[cfg(test)]
    pub(super) fn has_thread(&self) -> bool {
        self.worker.is_some()
    }
}

impl Drop for Sealer {
    fn drop(&mut self) {
        self.control.set(|f| f.paused = false);
        let _ = self.shutdown();
    }
}
