"""The Keras classes a model's code defines (model/keras_classes.py): found through the
contract's functions, their closures and the classes' own methods; Keras's own and a
library's are not collected, nor followed."""

import pytest

pytest.importorskip("tensorflow")
import keras  # noqa: E402

from elasticdl_nb.model.contract import ModelContract  # noqa: E402
from elasticdl_nb.model.keras_classes import keras_classes  # noqa: E402


def test_classes_reached_from_the_functions_closures_and_methods_are_found():
    class Inner(keras.layers.Layer):
        def call(self, x):
            return x

    class Outer(keras.layers.Layer):  # refers to Inner in a method only
        def build(self, shape):
            self.inner = Inner()

        def call(self, x):
            return self.inner(x)

    class Halved(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return 0.5 * keras.losses.mean_squared_error(y_true, y_pred)

    class Unused(keras.layers.Layer):
        pass

    def custom_model():
        return keras.Sequential([keras.Input((3,)), Outer(), keras.layers.Dense(1)])

    def loss(labels, predictions):
        return Halved()(labels, predictions)

    contract = ModelContract(custom_model, loss, lambda: keras.optimizers.SGD(0.1))
    found = keras_classes(contract)
    assert found == {"Outer": Outer, "Inner": Inner, "Halved": Halved}
    assert "Unused" not in found and "Dense" not in found
