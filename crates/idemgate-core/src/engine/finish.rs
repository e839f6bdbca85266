//! Recording what a call's side effect reported: the "done" write with bounded retries, then the
//! journal; the lease kept alive while the side effect runs; and the journal flushed into the
//! store once it takes writes again.

use super::*;
use crate::error::JournalError;

impl<S: Store> Engine<S> {
    /// The second half of a call begun with [`Engine::begin`]: records what the side effect
    /// reported (with bounded retries, then the journal) and answers.
    ///
    /// # Concurrent calls on the same key
    /// Duplicates waiting on the record wake when it settles and replay what this records. Two
    /// `finish`es of one ticket are safe: completing again under the same lease returns the first
    /// completion, and releasing an absent record succeeds. A `finish` whose lease was taken over
    /// meanwhile (the side effect outlived its lease) stores nothing: its answer says
    /// [`Recording::LeaseLost`], and the record keeps the other holder's outcome.
    ///
    /// # Cancellation
    /// Each store write is one atomic step, so dropping the future leaves the record either as it
    /// was (in flight under this lease, turning unknown when the lease ends, for an operator) or
    /// settled, never half written; an outcome already journaled is flushed later. It never lets
    /// the side effect run again.
    pub async fn finish(&self, ticket: &Ticket, reported: Effect) -> Answer {
        if !traced() {
            return self.record_outcome(ticket, reported).await;
        }
        let span = tracing::info_span!(
            target: TRACE_TARGET,
            "idemgate.complete",
            idemgate.recording = tracing::field::Empty,
        );
        // Boxed, as in `begin`: only a traced call pays for the span in its future.
        let answer = Box::pin(
            self.record_outcome(ticket, reported)
                .instrument(span.clone()),
        )
        .await;
        let recording = match &answer.decision {
            Decision::Executed { recording, .. } | Decision::NotApplied { recording, .. } => {
                Some(recording)
            }
            Decision::Unknown { recording, .. } => recording.as_ref(),
            _ => None,
        };
        if let Some(recording) = recording {
            span.record("idemgate.recording", recording.name());
        }
        answer
    }

    /// What [`Engine::finish`] does, inside its span.
    pub(super) async fn record_outcome(&self, ticket: &Ticket, reported: Effect) -> Answer {
        let (key, lease, keep) = (&ticket.key, ticket.lease, ticket.keep);
        // What the holder reported, for the history when its outcome comes too late to count.
        let reported_kind = match &reported {
            Effect::Success(_) => "success",
            Effect::Failed(_) => "a failure",
            Effect::NotApplied { .. } => "that the action did not apply",
            Effect::Ambiguous(_) => "an ambiguous outcome",
        };
        let decision = match reported {
            Effect::Success(body) => {
                self.store_outcome(key, lease, keep, Outcome::success(body), ticket.fingerprint)
                    .await
            }
            Effect::Failed(body) => {
                self.store_outcome(key, lease, keep, Outcome::failed(body), ticket.fingerprint)
                    .await
            }
            Effect::NotApplied { message, reply } => {
                let (_, recording) = self.record(key, lease, &JournalOp::Release, None).await;
                Decision::NotApplied {
                    message,
                    reply,
                    recording,
                }
            }
            Effect::Ambiguous(message) => {
                let (marked, recording) = self.mark_unknown(key, lease).await;
                Decision::Unknown {
                    since: marked.unwrap_or_else(|| self.clock.now()),
                    fence: lease.fence,
                    ran_here: true,
                    message: Some(message),
                    recording: Some(recording),
                }
            }
        };
        if let Some(entry) = self.history_of(&decision, lease.fence, reported_kind) {
            Box::pin(self.note(key, entry)).await;
        }
        let answer = Answer {
            key: Some(ticket.key.clone()),
            rule: Some(ticket.rule),
            decision,
        };
        self.observers.observe(&Event::Call {
            tenant: &ticket.key.tenant,
            tool: &ticket.key.tool,
            key: Some(&ticket.key),
            verdict: Verdict::of_answer(&answer),
            fence: Some(ticket.lease.fence),
            answer: Some(&answer),
            error: None,
        });
        answer
    }

    /// The history entry a finished call leaves on its record, if any: why its outcome became
    /// unknown, or that its outcome came after its lease was taken over and what it was
    /// (`reported`). A call that completes or releases its record leaves none: the record's
    /// state says it all.
    fn history_of(
        &self,
        decision: &Decision,
        fence: Fence,
        reported: &str,
    ) -> Option<HistoryEntry> {
        let (what, reason) = match decision {
            Decision::Unknown {
                recording: Some(Recording::Stored),
                message,
                ..
            } => (Happening::BecameUnknown, message.clone()),
            Decision::Executed {
                recording: Recording::LeaseLost,
                ..
            }
            | Decision::NotApplied {
                recording: Recording::LeaseLost,
                ..
            }
            | Decision::Unknown {
                recording: Some(Recording::LeaseLost),
                ..
            } => (
                Happening::LateOutcomeRefused,
                Some(format!(
                    "the call holding fence {fence} reported {reported} after its lease was \
                     taken over; the store refused it"
                )),
            ),
            _ => return None,
        };
        Some(HistoryEntry::new(
            self.clock.now(),
            fence,
            what,
            None,
            reason.as_deref(),
        ))
    }

    /// Appends `entry` to the history of `key`'s record, after the change it tells of landed.
    /// Best effort: a failed append loses the entry, never the change, and says so in the log
    /// (the audit log, where one is kept, has the same line).
    pub(super) async fn note(&self, key: &Key, entry: HistoryEntry) {
        match self.store.append_history(key, &entry).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                record = %key,
                what = %entry.what,
                "no record was there to keep this history entry"
            ),
            Err(e) => tracing::warn!(
                record = %key,
                what = %entry.what,
                reason = entry.reason.as_deref().unwrap_or(""),
                error = %e,
                "failed to append to the record's history"
            ),
        }
    }

    /// Extends the lease of a call begun with [`Engine::begin`] while its side effect runs.
    ///
    /// # Concurrent calls on the same key
    /// Only the ticket's own lease is extended: a record taken over meanwhile (this holder's
    /// lease ran out and another call took it) answers [`StoreError::LeaseLost`], and the holder
    /// should stop and report what it did; its `finish` will say the lease was lost. A heartbeat
    /// racing the ticket's own `finish` extends nothing once the record is settled (it answers
    /// [`StoreError::LeaseLost`] then too).
    ///
    /// # Cancellation
    /// One atomic store write: dropping the future leaves the lease either extended or as it was.
    ///
    /// # Errors
    /// [`StoreError::LeaseLost`] when the record was taken over meanwhile, or the store's error.
    pub async fn heartbeat(&self, ticket: &Ticket) -> Result<Timestamp, StoreError> {
        self.store
            .heartbeat(&ticket.key, ticket.lease, ticket.lease_for)
            .await
    }

    /// Marks the record held under `lease` unknown (with bounded retries, then the journal).
    /// Returns since when the record says it is unknown, when the store took the mark: the
    /// store's clock set it, and the answer must say what the record and every later answer
    /// say, not the engine's own time a write later.
    pub(super) async fn mark_unknown(
        &self,
        key: &Key,
        lease: Lease,
    ) -> (Option<Timestamp>, Recording) {
        let (_, recording) = self.record(key, lease, &JournalOp::MarkUnknown, None).await;
        if recording != Recording::Stored {
            return (None, recording);
        }
        // The ambiguous path only: one more read, for an answer that agrees with the record.
        let since = match self.store.get(key).await {
            Ok(Some(Record {
                fence,
                state: RecordState::Unknown { since },
                ..
            })) if fence == lease.fence => Some(since),
            _ => None,
        };
        (since, recording)
    }

    /// A completion time from the engine's clock, for outcomes the store has not confirmed.
    pub(super) fn local_completion(&self, ttl: Duration) -> Completion {
        let now = self.clock.now();
        Completion {
            completed_at: now,
            expires_at: now.plus(ttl),
        }
    }

    pub(super) async fn store_outcome(
        &self,
        key: &Key,
        lease: Lease,
        keep: Keep,
        outcome: Outcome,
        fingerprint: Option<Fingerprint>,
    ) -> Decision {
        let op = JournalOp::complete(outcome, keep);
        let (done, recording) = self.record(key, lease, &op, fingerprint).await;
        let done = done.unwrap_or_else(|| self.local_completion(keep.ttl));
        let JournalOp::Complete { outcome, .. } = op else {
            unreachable!("built as a completion above")
        };
        Decision::Executed {
            outcome,
            executed_at: done.completed_at,
            expires_at: done.expires_at,
            recording,
        }
    }

    /// Drives `fut` to completion, extending the lease every third of its length meanwhile: for
    /// a door that runs the side effect itself between [`Engine::begin`] and [`Engine::finish`]
    /// (the Node addon, whose function reports its effect to a future awaited here).
    pub async fn with_heartbeat(
        &self,
        ticket: &Ticket,
        fut: impl Future<Output = Effect>,
    ) -> Effect {
        let mut fut = std::pin::pin!(fut);
        // A side effect that is done at its first poll needs no timer at all.
        let first = std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
            std::task::Poll::Ready(e) => std::task::Poll::Ready(Some(e)),
            std::task::Poll::Pending => std::task::Poll::Ready(None),
        })
        .await;
        if let Some(reported) = first {
            return reported;
        }
        Box::pin(self.heartbeat_until_done(ticket, fut)).await
    }

    /// The slow path of [`Engine::with_heartbeat`], boxed so that calls that finish at once do
    /// not carry its timer in their future.
    pub(super) async fn heartbeat_until_done(
        &self,
        ticket: &Ticket,
        mut fut: Pin<&mut impl Future<Output = Effect>>,
    ) -> Effect {
        let every = (ticket.lease_for / 3).max(Duration::from_millis(1));
        let mut next = Instant::now() + every;
        loop {
            tokio::select! {
                biased;
                reported = &mut fut => return reported,
                _ = tokio::time::sleep_until(next) => {
                    // A failed heartbeat is not fatal: the next one may succeed, and a lease that
                    // is really lost shows up as LeaseLost when the outcome is recorded.
                    let _ = self.heartbeat(ticket).await;
                    next = Instant::now() + every;
                }
            }
        }
    }

    /// Applies a "done" write with bounded retries, then journals it. Returns the store's
    /// confirmation of a completion, if it gave one.
    /// `fingerprint` is the call's, when known, for the journal entry (see
    /// [`JournalEntry::fingerprint`]).
    pub(super) async fn record(
        &self,
        key: &Key,
        lease: Lease,
        op: &JournalOp,
        fingerprint: Option<Fingerprint>,
    ) -> (Option<Completion>, Recording) {
        match self.apply(key, lease, op, None).await {
            Ok(done) => (done, Recording::Stored),
            Err(StoreError::LeaseLost) => (None, Recording::LeaseLost),
            // Retries and the journal are the rare path: boxed, so that the common call's future
            // (all of which is copied on every call) does not carry their timers.
            Err(first) => {
                Box::pin(self.record_after_failure(key, lease, op, fingerprint, first)).await
            }
        }
    }

    pub(super) async fn record_after_failure(
        &self,
        key: &Key,
        lease: Lease,
        op: &JournalOp,
        fingerprint: Option<Fingerprint>,
        first: StoreError,
    ) -> (Option<Completion>, Recording) {
        // When the side effect reported (the first attempt failed at once): what the record says
        // as its execution time once the journal is flushed, not the time of the flush.
        let reported_at = self.clock.now();
        let mut last = first;
        let mut backoff = self.settings.finish_backoff;
        for _ in 1..self.settings.finish_attempts.max(1) {
            if !last.is_transient() {
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = backoff.saturating_mul(2);
            match self.apply(key, lease, op, None).await {
                Ok(done) => return (done, Recording::Stored),
                Err(StoreError::LeaseLost) => return (None, Recording::LeaseLost),
                Err(e) => last = e,
            }
        }
        let entry = JournalEntry {
            key: key.clone(),
            lease,
            op: op.clone(),
            journaled_at: reported_at,
            fingerprint,
        };
        let appended = self.append_to_journal(entry).await;
        // The answer says the time the record will say once the journal is flushed (the flush
        // stores it as the completion time), not the time the retries and the journal took.
        let at_report = match op {
            JournalOp::Complete { ttl_ms, .. } => Some(Completion {
                completed_at: reported_at,
                expires_at: reported_at.plus(Duration::from_millis(*ttl_ms)),
            }),
            JournalOp::Release | JournalOp::MarkUnknown | JournalOp::TakeBack => None,
        };
        match appended {
            Ok(()) => (at_report, Recording::Journaled),
            Err(e) => (at_report, Recording::Unrecorded(e.to_string())),
        }
    }

    /// Appends `entry` to the journal and, once it is there, wakes the flusher.
    pub(super) async fn append_to_journal(&self, entry: JournalEntry) -> Result<(), JournalError> {
        // A durable journal fsyncs: on a blocking thread, so the async workers keep serving.
        let journal = Arc::clone(&self.journal);
        let appended = tokio::task::spawn_blocking(move || journal.append(&entry))
            .instrument(tracing::info_span!(target: TRACE_TARGET, "idemgate.journal"))
            .await
            .unwrap_or_else(|e| {
                Err(JournalError::new(
                    format!("the journal writer failed: {e}"),
                    e,
                ))
            });
        if appended.is_ok() {
            self.journaled.notify_one();
        }
        appended
    }

    /// Applies a "done" write; `executed_at` is when the side effect reported, for writes applied
    /// later than that (journal flushes).
    pub(super) async fn apply(
        &self,
        key: &Key,
        lease: Lease,
        op: &JournalOp,
        executed_at: Option<Timestamp>,
    ) -> Result<Option<Completion>, StoreError> {
        match op {
            JournalOp::Complete {
                outcome,
                ttl_ms,
                tombstone_ms,
            } => self
                .store
                .complete_at(
                    key,
                    lease,
                    outcome,
                    JournalOp::keep(*ttl_ms, *tombstone_ms),
                    executed_at,
                )
                .await
                .map(Some),
            JournalOp::Release => self.store.release(key, lease).await.map(|()| None),
            JournalOp::MarkUnknown => self.store.mark_unknown(key, lease).await.map(|()| None),
            // Not a done write: the engine journals it without trying it here, and the flush
            // applies it with the entry's fingerprint (`take_back`).
            JournalOp::TakeBack => Err(StoreError::misconfigured(format!(
                "failed to apply the take-back of a reservation of {key} as a done write"
            ))),
        }
    }

    /// Takes back the reservation of a [`JournalOp::TakeBack`] entry: reserved again with its
    /// token, which finds the record it made if that is still there (in flight, or unknown once
    /// its lease ended) and releases it. Another call's record is left as it is.
    async fn take_back(&self, entry: &JournalEntry) -> Result<(), StoreError> {
        let Some(again) = reserved_again(entry) else {
            return Ok(());
        };
        match self.store.reserve(&again).await? {
            Claim::Acquired(lease) => self.store.release(&entry.key, lease).await,
            Claim::Existing(_) => Ok(()),
        }
    }

    /// Replays journaled writes into the store. Call it at start-up and now and then; entries the
    /// store still refuses stay for the next flush.
    ///
    /// # Errors
    /// [`EngineError::Journal`] when the journal cannot be read or an applied entry cannot be
    /// removed.
    pub async fn flush_journal(&self) -> Result<FlushReport, EngineError> {
        let flushed = self.flush_journal_entries().await;
        if !matches!(&flushed, Ok(r) if *r == FlushReport::default()) {
            self.observers.observe(&Event::Flushed(&flushed));
        }
        flushed
    }

    /// Flushes the journal now, then every `every` in a task of its own, for as long as the
    /// returned handle lives. The one place a front door starts it: call it once at start-up.
    pub fn spawn_journal_flusher(self: &Arc<Self>, every: Duration) -> JournalFlusher
    where
        S: 'static,
    {
        let engine = Arc::clone(self);
        let journaled = Arc::clone(&self.journaled);
        JournalFlusher(tokio::spawn(async move {
            loop {
                // While entries wait for the store, try again soon: other processes hold off
                // judging the records for only `Settings::unknown_settle` after the store is back.
                let next = match engine.flush_journal().await {
                    Ok(r) if r.pending == 0 => every,
                    _ => FLUSH_RETRY,
                };
                tokio::select! {
                    () = tokio::time::sleep(next) => {}
                    () = journaled.notified() => {}
                }
            }
        }))
    }

    pub(super) async fn flush_journal_entries(&self) -> Result<FlushReport, EngineError> {
        let entries = self.journal.pending().map_err(EngineError::Journal)?;
        if entries.is_empty() {
            return Ok(FlushReport::default());
        }
        // A span only for a flush that has something to send: the flusher looks every 30 s.
        let span = tracing::info_span!(
            target: TRACE_TARGET,
            "idemgate.flush",
            idemgate.entries = entries.len(),
            idemgate.applied = tracing::field::Empty,
            idemgate.pending = tracing::field::Empty,
        );
        let flushed = self.apply_entries(entries).instrument(span.clone()).await;
        if let Ok(report) = &flushed {
            span.record("idemgate.applied", report.applied);
            span.record("idemgate.pending", report.pending);
        }
        flushed
    }

    pub(super) async fn apply_entries(
        &self,
        entries: Vec<JournalEntry>,
    ) -> Result<FlushReport, EngineError> {
        let mut report = FlushReport::default();
        for entry in entries {
            let applied = match entry.op {
                JournalOp::TakeBack => self.take_back(&entry).await.map(|()| None),
                _ => {
                    self.apply(&entry.key, entry.lease, &entry.op, Some(entry.journaled_at))
                        .await
                }
            };
            match applied {
                Ok(_) => report.applied += 1,
                Err(StoreError::LeaseLost) => match self.restore(&entry).await {
                    Ok(Restored::WrittenBack) => {
                        report.applied += 1;
                        report.restored += 1;
                    }
                    Ok(Restored::Superseded) => report.superseded += 1,
                    Ok(Restored::Displaced) => report.displaced += 1,
                    Err(_) => {
                        report.pending += 1;
                        continue;
                    }
                },
                Err(_) => {
                    report.pending += 1;
                    continue;
                }
            }
            self.journal.remove(&entry).map_err(EngineError::Journal)?;
        }
        Ok(report)
    }

    /// What becomes of a journaled write whose lease the store no longer has. A takeover is
    /// reported only when the record stands at a higher fence. A completion whose record is gone
    /// (the store lost it: an asynchronous standby promoted, a backup restored) is written back,
    /// reserved again under the entry's own token and completed with its execution time, so the
    /// acknowledged outcome is replayed rather than the action run again; a record left in
    /// flight by a write-back that was cut off is the entry's own (same token) and is completed
    /// on the next flush. Anything else (another call's record at a fence not above ours, or an
    /// entry without the call's fingerprint) is displaced: dropped, and said so.
    async fn restore(&self, entry: &JournalEntry) -> Result<Restored, StoreError> {
        let complete = matches!(entry.op, JournalOp::Complete { .. });
        match self.store.get(&entry.key).await? {
            Some(r) if r.fence > entry.lease.fence => return Ok(Restored::Superseded),
            _ if !complete => return Ok(Restored::Superseded),
            _ => {}
        }
        let Some(again) = reserved_again(entry) else {
            return Ok(Restored::Displaced);
        };
        match self.store.reserve(&again).await? {
            Claim::Acquired(lease) => {
                self.apply(&entry.key, lease, &entry.op, Some(entry.journaled_at))
                    .await?;
                self.replays.remove(&entry.key);
                Ok(Restored::WrittenBack)
            }
            Claim::Existing(r) if r.fence > entry.lease.fence => Ok(Restored::Superseded),
            Claim::Existing(_) => Ok(Restored::Displaced),
        }
    }
}

/// The reservation a journal entry was made under, again: its token (which finds the record it
/// made, if that is still there) and the call's fingerprint; `None` for an entry written without
/// the fingerprint.
fn reserved_again(entry: &JournalEntry) -> Option<Reservation> {
    Some(Reservation {
        key: entry.key.clone(),
        fingerprint: entry.fingerprint?,
        token: entry.lease.token,
        lease_for: RESTORE_LEASE,
        scope: None,
    })
}

/// What a flush did with an entry whose lease the store no longer has.
enum Restored {
    /// Written back as a new record of the same action.
    WrittenBack,
    /// The record stands at a higher fence: another call took it over.
    Superseded,
    /// Another call's record stands at a fence not above the entry's, or the entry cannot be
    /// written back: dropped.
    Displaced,
}

/// How long a write-back holds the record between its reservation and its completion.
const RESTORE_LEASE: Duration = Duration::from_secs(30);
