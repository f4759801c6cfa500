"""The ElasticDL model-zoo contract, resolved into one object.

A model module defines `custom_model()` (a Keras model), `loss(labels, predictions)`,
`optimizer()`, `feed(dataset, mode, metadata)` (or its older name `dataset_fn`),
optionally `eval_metrics_fn()`, `callbacks()` and, for a job with prediction data, a
`PredictionOutputsProcessor` class (ElasticDL's name; `prediction_outputs_processor` in
the SDK) whose `process(predictions, worker_id)` each worker calls with every minibatch's
predictions, and a `custom_data_reader` for data in a form of its own
(`custom_data_reader.py`). `ModelContract` holds those functions, however they were given
(a model-zoo file, a module object, or functions passed to the SDK).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticdl_nb.errors import ElasticDLError


class ContractError(ElasticDLError, ValueError):
    """The model definition is incomplete or unusable; the message says what to define."""


class Mode:
    """The `mode` passed to `feed`; the same values as ElasticDL's `Mode`."""

    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


class BasePredictionOutputsProcessor:
    """What a model's `PredictionOutputsProcessor` is (ElasticDL's base class, by its
    name): `process` is called on each worker with every minibatch's predictions (NumPy,
    in the model's output structure) as they are made; a minibatch whose task is redone
    after its worker was lost is given again."""

    def process(self, predictions: Any, worker_id: int) -> None:
        raise NotImplementedError("define process(self, predictions, worker_id)")


REQUIRED = ("custom_model", "loss", "optimizer")
OPTIONAL = (
    "feed",
    "eval_metrics_fn",
    "callbacks",
    "prediction_outputs_processor",
    "custom_data_reader",
)
# Other names the contract's entries go by in a module (ElasticDL's, older or its own).
ALIASES = {"dataset_fn": "feed", "PredictionOutputsProcessor": "prediction_outputs_processor"}


@dataclass
class ModelContract:
    custom_model: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[], Any]
    feed: Callable[[Any, str, Any], Any] | None = None
    eval_metrics_fn: Callable[[], Mapping[str, Any]] | None = None
    callbacks: Callable[[], list] | None = None
    prediction_outputs_processor: Any = None  # a class, or an object with `process`
    custom_data_reader: Callable[..., Any] | None = None  # (model/custom_data_reader.py)

    def build_model(self) -> Any:
        """A fresh Keras model from `custom_model()`; ContractError if it is not one."""
        from elasticdl_nb.keras_flavor import keras

        model = self.custom_model()
        if not isinstance(model, keras.Model):
            raise ContractError(
                f"custom_model() returned {type(model).__name__}, not a Keras "
                "model: return e.g. keras.Sequential([...]) or keras.Model(...)."
            )
        return model

    def make_prediction_processor(self) -> Any:
        """The object whose `process(predictions, worker_id)` gets each minibatch's
        predictions (one per worker process), or None."""
        given = self.prediction_outputs_processor
        if given is None:
            return None
        processor = given() if isinstance(given, type) else given
        if not callable(getattr(processor, "process", None)):
            raise ContractError(
                f"The prediction outputs processor {type(processor).__name__} has no "
                "process(predictions, worker_id) method: define one (ElasticDL's "
                "BasePredictionOutputsProcessor says the same)."
            )
        return processor

    def version_schedule(self) -> Callable[[int], float] | None:
        """The learning rate by model version of an ElasticDL `LearningRateScheduler`
        among `callbacks()` (applied where updates are: each PS, each replica), if any."""
        if self.callbacks is None:
            return None
        from elasticdl_nb.callbacks import LearningRateScheduler

        found = [c for c in self.callbacks() if isinstance(c, LearningRateScheduler)]
        return found[-1].rate_at if found else None

    @classmethod
    def from_namespace(
        cls,
        namespace: Mapping[str, Any],
        model_fn_name: str = "custom_model",
        where: str = "the model definition",
    ) -> ModelContract:
        """Pick the contract's functions out of a module's (or a dict's) names."""
        found: dict[str, Any] = {}
        model_fn = namespace.get(model_fn_name)
        if model_fn is None:
            raise ContractError(
                f"{where} has no '{model_fn_name}': define a function that "
                "builds and returns the Keras model."
            )
        found["custom_model"] = model_fn
        for name in REQUIRED[1:]:
            if namespace.get(name) is None:
                raise ContractError(f"{where} does not define '{name}'. " + _HINTS[name])
            found[name] = namespace[name]
        for name in OPTIONAL:
            aliases = [alias for alias, meant in ALIASES.items() if meant == name]
            found[name] = next(
                (namespace[n] for n in (name, *aliases) if namespace.get(n) is not None), None
            )
        for name, fn in found.items():
            if name == "prediction_outputs_processor":
                continue  # (a class, or an object with `process`: checked when made)
            if fn is not None and not callable(fn):
                raise ContractError(
                    f"'{name}' in {where} must be a function, got {type(fn).__name__}."
                )
        return cls(**found)


def call_model(model, features: Any, training: bool):
    """`model(features)`, taking features as ElasticDL's feeds give them: a feed may key a
    single-input model's features by a name of its own (`{"feature": ids}` for a model
    whose one Input has another name), which Keras 2's `model.call` took as the one input
    and Keras 3 refuses ("Missing data for input")."""
    try:
        inputs = model.inputs  # (none for a subclassed model: it takes what it is given)
    except (AttributeError, ValueError):
        inputs = None
    if isinstance(features, Mapping) and len(features) == 1 and inputs and len(inputs) == 1:
        ((name, value),) = features.items()
        if name != inputs[0].name:
            features = value
    return model(features, training=training)


_HINTS = {
    "loss": "Add `def loss(labels, predictions): return <a scalar tensor>`.",
    "optimizer": "Add `def optimizer(): return tf.keras.optimizers.SGD(0.1)` (any Keras "
    "optimizer).",
}
