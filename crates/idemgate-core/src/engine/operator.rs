//! The operator's calls: looking records up, purging, resolving unknown outcomes and reopening
//! records, each a compare-and-set on the fence the operator looked at.

use super::*;

impl<S: Store> Engine<S> {
    /// The record, if one counts.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn get(&self, key: &Key) -> Result<Option<Record>, EngineError> {
        Ok(self.store.get(key).await?)
    }

    /// Records that pass `filter`.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, EngineError> {
        Ok(self.store.list(filter).await?)
    }

    /// How many records pass `filter`, all pages together, counting at most `at_most`
    /// ([`Store::count`]).
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn count(&self, filter: &ListFilter, at_most: usize) -> Result<usize, EngineError> {
        Ok(self.store.count(filter, at_most).await?)
    }

    /// Deletes expired completed records; returns how many.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn purge_expired(&self) -> Result<u64, EngineError> {
        Ok(self.store.purge_expired().await?)
    }

    /// Resolves an unknown record as an operator decided: by taking it over (a compare-and-set on
    /// `fence`, the fence the operator looked at) and completing or releasing it. `by` and
    /// `reason` say who and why, for the observers (the audit log).
    ///
    /// # Errors
    /// [`EngineError::NotFound`] when no record counts, [`EngineError::NotResolvable`] when it is
    /// not unknown or its fence moved on, [`EngineError::Store`] when the store fails.
    pub async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: Resolution,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Option<Record>, EngineError> {
        let not_resolvable = |record: &Record| EngineError::NotResolvable {
            key: key.clone(),
            state: record.state_name(),
            fence: record.fence,
        };
        let record = self.operator_look(key).await?;
        if !matches!(record.state, RecordState::Unknown { .. }) || record.fence != fence {
            return Err(not_resolvable(&record));
        }
        let lease = self
            .take_over_unknown(&record)
            .await?
            .map_err(|now| not_resolvable(&now))?;
        let released = matches!(resolution, Resolution::Release);
        match resolution {
            Resolution::Completed { outcome, keep } => {
                self.store
                    .complete_at(key, lease, &outcome, keep, None)
                    .await?;
            }
            // Settled as absent rather than removed, so that the record keeps its fence and
            // its history: see `Resolution::Release`.
            Resolution::Release => self.settle_as_absent(key, lease).await?,
        }
        let what = match released {
            true => Happening::ResolvedReleased,
            false => Happening::ResolvedCompleted,
        };
        self.note(
            key,
            HistoryEntry::new(self.clock.now(), fence, what, by, reason),
        )
        .await;
        self.observers.observe(&Event::Resolved {
            key,
            fence,
            released,
            by,
            reason,
        });
        Ok(self.store.get(key).await?)
    }

    /// Reopens a completed or unknown record, as an operator (or a program) decided: the record
    /// counts as absent from now on, so that the next call with its key runs the action again.
    /// A compare-and-set on `fence`, the fence the caller looked at. Reopening is the one way a
    /// completed outcome stops being replayed before it expires: this engine forgets its copy at
    /// once, other processes' engines within [`Settings::replay_cache_fresh`]. A completed record
    /// is expired now ([`Store::reopen`]); an unknown one is taken over at `fence` and completed
    /// with an expiry of now. Either way the record keeps its fence, the next call's reservation
    /// takes a higher one, and a reopening retried at `fence` is refused instead of reopening
    /// the new record. `by` and `reason` say who and why, for the observers (the audit log).
    /// Returns the state the record had.
    ///
    /// A record in flight is never reopened: its call may be running the action now, and a
    /// second call would run it concurrently. Once its lease ends it reads unknown.
    ///
    /// # Errors
    /// [`EngineError::NotFound`] when no record counts (an expired one included),
    /// [`EngineError::NotReopenable`] when it is in flight or its fence moved on,
    /// [`EngineError::Store`] when the store fails.
    pub async fn reopen(
        &self,
        key: &Key,
        fence: Fence,
        by: Option<&str>,
        reason: Option<&str>,
    ) -> Result<State, EngineError> {
        let not_reopenable = |record: &Record| EngineError::NotReopenable {
            key: key.clone(),
            state: record.state_name(),
            fence: record.fence,
        };
        let record = self.operator_look(key).await?;
        if record.fence != fence {
            return Err(not_reopenable(&record));
        }
        let was = record.state_name();
        match record.state {
            RecordState::InFlight { .. } => return Err(not_reopenable(&record)),
            RecordState::Completed { .. } | RecordState::Expired { .. } => {
                match self.store.reopen(key, fence).await? {
                    Reopened::Expired => {}
                    Reopened::Kept(Some(now)) => return Err(not_reopenable(&now)),
                    Reopened::Kept(None) => return Err(EngineError::NotFound { key: key.clone() }),
                }
            }
            RecordState::Unknown { .. } => {
                let lease = self
                    .take_over_unknown(&record)
                    .await?
                    .map_err(|now| not_reopenable(&now))?;
                self.settle_as_absent(key, lease).await?;
            }
        }
        self.replays.remove(key);
        let mut entry = HistoryEntry::new(self.clock.now(), fence, Happening::Reopened, by, reason);
        entry.was = Some(was);
        self.note(key, entry).await;
        self.observers.observe(&Event::Reopened {
            key,
            fence,
            was,
            by,
            reason,
        });
        Ok(was)
    }

    /// The record of `key`, if one counts, and the history stored under the key (which a record
    /// that counts as absent, released or reopened, may still have): one record as an operator
    /// views it.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn record_and_history(
        &self,
        key: &Key,
    ) -> Result<(Option<Record>, Vec<HistoryEntry>), EngineError> {
        let record = self.store.get(key).await?;
        Ok((record, self.store.history(key).await?))
    }

    /// The history of `key`'s record ([`Store::history`]), oldest first.
    ///
    /// # Errors
    /// [`EngineError::Store`] when the store fails.
    pub async fn history(&self, key: &Key) -> Result<Vec<HistoryEntry>, EngineError> {
        Ok(self.store.history(key).await?)
    }

    /// Settles the record held under `lease` as absent: as a completion that expires at once,
    /// rather than a release, so that the record keeps its fence (the next reservation takes a
    /// higher one, see `Store::reopen`) and its history. Its outcome is never replayed.
    async fn settle_as_absent(&self, key: &Key, lease: Lease) -> Result<(), EngineError> {
        let nothing = Outcome::failed(Vec::new());
        self.store
            .complete(key, lease, &nothing, Duration::ZERO)
            .await?;
        Ok(())
    }

    /// The record an operator acts on, read from the store (never from the replay cache).
    pub(super) async fn operator_look(&self, key: &Key) -> Result<Record, EngineError> {
        self.store
            .get(key)
            .await?
            .ok_or_else(|| EngineError::NotFound { key: key.clone() })
    }

    /// Takes the unknown `record` over at its fence for an operator, who then settles it. `Err`
    /// holds the record as it stands when somebody changed it first.
    pub(super) async fn take_over_unknown(
        &self,
        record: &Record,
    ) -> Result<Result<Lease, Record>, EngineError> {
        let r = Reservation::new(
            record.key.clone(),
            record.fingerprint,
            Duration::from_secs(30),
        );
        Ok(match self.store.takeover(&r, record.fence).await? {
            Claim::Acquired(lease) => Ok(lease),
            Claim::Existing(now) => Err(now),
        })
    }
}
