//! One `tools/call`, from the frame to its answer, through every part the session owns: the
//! judge reads it, the tools say what the server said of it (listing them when they must), the
//! judge names its key and policy, the handshake puts it in the server's era's words, and the
//! judge runs it at most once through the peer.

use idemgate_core::Store;
use serde_json::value::RawValue;

use super::Inner;
use crate::gate::catalog::TaskSupport;
use crate::gate::CarriedKey;
use crate::wire::era;
use crate::wire::frame;

impl<S: Store> Inner<S> {
    /// Judges one `tools/call` and returns the frame that answers it.
    pub(super) async fn call(
        &self,
        id: &RawValue,
        line: String,
        params: Option<&RawValue>,
        carried: CarriedKey,
    ) -> String {
        let params = params.and_then(frame::object).unwrap_or_default();
        let (request, arguments) = match self.judge.read(id, &params) {
            Ok(read) => read,
            Err(refusal) => return refusal,
        };
        let tool = self
            .tools
            .describe(&self.peer, &request.name, era::envelope(&params))
            .await;
        let mut prepared =
            match self
                .judge
                .prepare(&request, arguments, tool.as_ref(), carried, line)
            {
                Ok(p) => p,
                Err(refusal) => return refusal,
            };
        let support = tool
            .as_ref()
            .map_or(TaskSupport::Forbidden, |t| t.task_support);
        prepared.frame = match self.handshake.call_frame(
            id,
            &request.name,
            prepared.frame,
            &params,
            request.result_type,
            support,
        ) {
            Ok(f) => f,
            Err(refusal) => return refusal,
        };
        self.judge.run(&request, prepared, &self.peer).await
    }
}
