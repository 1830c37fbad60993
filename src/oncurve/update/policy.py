"""The trained policy and every view of it: one object instead of five handles.

Which module to use is the whole difficulty: the optimizer updates `model` (shards of it under
FSDP2), the update's forward goes through `train_forward` (DDP / FSDP2 wrapped, so that the
gradient hooks fire), sampling, evaluation and saving read whole weights (`whole()`), and pi_ref
is a frozen copy or, with LoRA, the same weights with the adapter switched off. `Policy` holds
them all and offers only the operations, so that no caller picks a handle.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from oncurve import distributed
from oncurve.model.forward import PolicyLogprobs
from oncurve.model.weights import frozen_copy, offload_weights, weights_on
from oncurve.types import TrainBatch
from oncurve.update.microbatches import ForwardSettings, batch_logprobs


class Policy:
    """pi_theta with its reference pi_ref, its wrappers and its forward settings.

    Attributes:
        model: the trained Hugging Face causal LM (the base model under LoRA); under FSDP2 its
            parameters are shards. The optimizer's parameters are its trainable ones.
        train_forward: `PolicyLogprobs(model)`, DDP- or FSDP2-wrapped under data parallelism:
            the module the update calls.
        reference: the frozen pi_ref copy, or None (beta = 0, or LoRA: the adapter switched off);
            offloaded, its weights are in host memory but during `reference_logprobs`.
        reference_synced: whether `reference` has left the initial weights (`sync_reference`,
            or a resume that restored a synced one): only then does a checkpoint keep it.
        peft_model: the PEFT wrapper under LoRA, else None.
        forward: how every training-side forward runs (`ForwardSettings`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        forward: ForwardSettings,
        peft_model: torch.nn.Module | None = None,
        with_reference: bool = False,
        offload_reference: bool = False,
        fsdp: bool = False,
    ) -> None:
        """Wrap `model` (loaded, on its device, gradient checkpointing set; under LoRA the base
        model of `peft_model`). `with_reference` keeps a frozen pi_ref (not needed with LoRA),
        in host memory but for its pass with `offload_reference`; `fsdp` shards the weights
        across ranks."""
        self.peft_model = peft_model
        self.model = model
        self.forward = forward
        self.device = next(model.parameters()).device
        self.reference = frozen_copy(model) if with_reference and self.peft_model is None else None
        self.reference_offloaded = offload_reference and self.reference is not None
        self.reference_synced = False
        if self.reference_offloaded:
            offload_weights(self.reference)
        # Under FSDP2 each rank holds shards of the trained weights; sampling, evaluation,
        # checkpoints and the final model read whole weights from a copy gathered for them and
        # emptied after (`whole`), so the update's peak does not hold it.
        self.whole_model = frozen_copy(model) if fsdp else model
        # before the optimizer: fully_shard replaces the parameters with sharded ones
        self.train_forward = distributed.wrap(PolicyLogprobs(model), self.device.type, fsdp=fsdp)
        self.fsdp = fsdp

    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (all, or the LoRA adapters)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def whole(self) -> AbstractContextManager[torch.nn.Module]:
        """The policy with whole weights, for the duration (see `distributed.gathered`); the
        sampler was built on `whole_model` and reads it only inside."""
        return distributed.gathered(self.model, self.whole_model)

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """`[N, T]` logprobs under the current weights (pi_old), no graph kept."""
        return batch_logprobs(self.train_forward, batch, self.forward)

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """`[N, T]` logprobs under pi_ref: the frozen copy, or with LoRA the same weights with
        the adapter switched off."""
        forward = self.forward.for_reference()
        if self.reference_offloaded:
            with weights_on(self.reference, self.device) as reference:
                return batch_logprobs(PolicyLogprobs(reference), batch, forward)
        if self.peft_model is None:
            return batch_logprobs(PolicyLogprobs(self.reference), batch, forward)
        with self.peft_model.disable_adapter():
            return batch_logprobs(self.train_forward, batch, forward)

    def sync_reference(self) -> None:
        """pi_ref <- pi_theta (`algo.ref_sync_every`)."""
        with self.whole() as policy:
            self.reference.load_state_dict(policy.state_dict())
        self.reference_synced = True

    def release(self) -> None:
        """Under FSDP2, empty the whole-weights copy until the next `whole()`."""
        if self.fsdp:
            distributed.release(self.whole_model)
