"""An MNIST-like CNN in ElasticDL's model-zoo style, written for Keras 2: the image gets
its channel axis from `K.expand_dims` on the symbolic input (Keras 3 refuses that). The
data are 8x8 images of ten bar patterns under heavy noise (`write_arrays`): what a class
looks like is known, and the noise makes it a task a model can fail."""

import numpy as np
import tensorflow as tf
from tensorflow.keras import backend as K


def custom_model():
    pixels = tf.keras.Input(shape=(8, 8), name="image")
    x = K.expand_dims(pixels, -1)
    x = tf.keras.layers.Conv2D(16, 3, activation="relu", padding="same")(x)
    x = tf.keras.layers.MaxPooling2D(2)(x)
    x = tf.keras.layers.Conv2D(32, 3, activation="relu")(x)
    x = tf.keras.layers.Flatten()(x)
    return tf.keras.Model(pixels, tf.keras.layers.Dense(10)(x), name="mnist_cnn")


def loss(labels, predictions):
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        tf.keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer(lr=0.01):
    return tf.keras.optimizers.SGD(learning_rate=lr, momentum=0.9)


def eval_metrics_fn():
    return {
        "accuracy": lambda labels, predictions: tf.cast(
            tf.equal(tf.argmax(predictions, 1, output_type=tf.int32), tf.reshape(labels, [-1])),
            tf.float32,
        )
    }


def patterns() -> np.ndarray:
    """Ten 8x8 bar patterns: rows 1, 3, 5, 6, columns 1, 3, 5, 6, both diagonals."""
    out = np.zeros((10, 8, 8), np.float32)
    for k, r in enumerate((1, 3, 5, 6)):
        out[k, r, :] = 1.0
        out[4 + k, :, r] = 1.0
    out[8] = np.eye(8)
    out[9] = np.fliplr(np.eye(8))
    return out


def write_arrays(n: int, seed: int):
    """(images, labels): each image its class's pattern under Gaussian noise of sd 0.7."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n).astype(np.int32)
    images = patterns()[labels] + rng.normal(0.0, 0.7, size=(n, 8, 8)).astype(np.float32)
    return images.astype(np.float32), labels
