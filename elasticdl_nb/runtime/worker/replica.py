"""A full replica of the user's Keras model and optimizer, for the allreduce strategy.

Every member of the group holds one. A step is split around the allreduce:
`gradients` (forward and backward on this member's minibatch, as one flat float32 vector
scaled by the minibatch's record count, so the group's sum divided by the summed counts
is the gradient averaged over every record of the step), then `apply` (the contract's
optimizer on the averaged vector). Embedding gradients arrive as `IndexedSlices` and are
made dense: every replica holds whole tables.

`state()` / `set_state()` move the whole replica (weights, optimizer slots and its
iteration count) to a member that joins; `checksum()` proves replicas identical.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import tensorflow as tf

from elasticdl_nb.keras_flavor import keras, optimizer_variables
from elasticdl_nb.model.contract import ContractError, ModelContract, call_model
from elasticdl_nb.model.metrics import make_eval_metrics
from elasticdl_nb.runtime.compiled_call import CompiledCall


class Replica:
    def __init__(self, contract: ModelContract):
        self.contract = contract
        self.model = contract.build_model()
        self.optimizer = contract.optimizer()
        self._rate_at = contract.version_schedule()  # (ElasticDL's LearningRateScheduler)
        self.built = False
        self._gradients: CompiledCall | None = None

    # ------------------------------------------------------------------ building

    def build(self, features: Any) -> None:
        """Create the model's and the optimizer's variables, so that the state is whole
        before the first step (a joiner receives it all at once)."""
        call_model(self.model, features, training=False)
        self.variables = list(self.model.trainable_variables)
        self.optimizer.build(self.variables)
        self._sizes = [int(np.prod(v.shape)) for v in self.variables]
        self.size = sum(self._sizes)
        self.metrics = make_eval_metrics(self.contract)
        self._base_lr = self._learning_rate()
        self._compile()
        self.built = True

    def _learning_rate(self) -> float | None:
        lr = self.optimizer.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) or callable(lr):
            return None
        return float(np.asarray(lr))

    def _compile(self) -> None:
        model, loss_fn, variables = self.model, self.contract.loss, self.variables
        optimizer, sizes, metrics = self.optimizer, self._sizes, list(self.metrics.values())

        def gradients(features, labels):
            with tf.GradientTape() as tape:
                predictions = call_model(model, features, training=True)
                loss = loss_fn(labels, predictions)
                if model.losses:
                    loss = loss + tf.add_n(model.losses)
            grads = tape.gradient(loss, variables)
            count = tf.cast(tf.shape(tf.nest.flatten(labels)[0])[0], tf.float32)
            flat = [
                tf.zeros([size]) if g is None else tf.reshape(tf.convert_to_tensor(g), [-1])
                for g, size in zip(grads, sizes)
            ]
            return tf.cast(loss, tf.float32), tf.concat(flat, 0) * count

        self._gradients_fn = gradients

        def apply(flat_mean):
            parts = tf.split(flat_mean, sizes)
            optimizer.apply_gradients(
                [(tf.reshape(p, v.shape), v) for p, v in zip(parts, variables)]
            )

        @tf.function(reduce_retracing=True)
        def evaluate(features, labels):
            predictions = call_model(model, features, training=False)
            for metric in metrics:
                metric.update_state(labels, predictions)

        @tf.function(reduce_retracing=True)
        def predict(features):
            return call_model(model, features, training=False)

        signature = [tf.TensorSpec([sum(sizes)], tf.float32)]
        self._apply = CompiledCall(apply, signature, "apply")  # (see compiled_call.py)
        self._evaluate, self._predict = evaluate, predict

    # ------------------------------------------------------------------ steps

    def gradients(self, features: Any, labels: Any) -> tuple[float, np.ndarray]:
        """(mean loss, gradient × records) of one minibatch, as one flat float32 vector."""
        if self._gradients is None:  # one trace for every batch size (see ModelRunner)

            def spec(x):
                x = tf.convert_to_tensor(x)
                return tf.TensorSpec([None, *x.shape[1:]], x.dtype)

            signature = [tf.nest.map_structure(spec, features), tf.nest.map_structure(spec, labels)]
            self._gradients = CompiledCall(self._gradients_fn, signature, "gradients")
        loss, flat = self._gradients(features, labels)
        return float(loss), flat.numpy()

    def apply(self, flat_mean: np.ndarray, rate: float | None = None) -> float:
        """The optimizer's update with the group's averaged gradients, at `rate` if the
        master's callbacks set one; returns the learning rate it was applied with (a
        schedule's at this step)."""
        if rate:
            self.optimizer.learning_rate = rate
        if self._rate_at is not None:  # the step about to be applied: its iterations
            self.optimizer.learning_rate = self._rate_at(int(self.optimizer.iterations))
        rate = float(np.asarray(self.optimizer.learning_rate))
        self._apply(np.asarray(flat_mean, np.float32))
        return rate

    def scale_learning_rate(self, factor: float) -> None:
        """Set the learning rate to the optimizer's own times `factor` (lr_scaling)."""
        if self._base_lr is None:
            raise ContractError(
                "lr_scaling='linear' needs a constant learning rate, and the optimizer has "
                "a schedule: drop lr_scaling, or scale inside the schedule."
            )
        self.optimizer.learning_rate = self._base_lr * factor

    def learning_rate(self) -> float | None:
        """The optimizer's current learning rate (None with a schedule)."""
        return None if self._base_lr is None else float(np.asarray(self.optimizer.learning_rate))

    def eval_step(self, features: Any, labels: Any) -> None:
        self._evaluate(features, labels)

    def predict(self, features: Any) -> Any:
        """The model's outputs on `features` (inference: dropout off)."""
        return self._predict(features)

    # ------------------------------------------------------------------ state

    def _state_variables(self) -> list:
        return list(self.model.weights) + optimizer_variables(self.optimizer)

    def state(self) -> list[np.ndarray]:
        """Everything a replica is: model weights (trainable or not) and optimizer slots."""
        return [np.asarray(v.numpy()) for v in self._state_variables()]

    def set_state(self, arrays: list[np.ndarray]) -> None:
        variables = self._state_variables()
        if len(arrays) != len(variables):
            raise ValueError(f"state of {len(arrays)} arrays for {len(variables)} variables")
        for var, value in zip(variables, arrays):
            var.assign(value)

    def checksum(self) -> str:
        """SHA-256 over the bytes of the whole state: equal iff the replicas are."""
        digest = hashlib.sha256()
        for value in self.state():
            digest.update(np.ascontiguousarray(value).tobytes())
        return digest.hexdigest()
