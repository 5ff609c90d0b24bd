"""The Keras front door: split a Keras model, train it with `fit`.

`split.from_keras` cuts a functional, Sequential or keras_hub model into
`InterlockModule`s; `model.InterlockModel` is the `keras.Model` that trains
them with interlocking backpropagation through Keras's own `fit`,
`evaluate`, `predict`, callbacks, metrics and saving. The rest of the
package serves these two: the graph walk (`flatten`, `nodes`, `blocks`,
`ties`, `layer_state`, `input_nest`, `origins`), `fit`'s data and step (`fit`,
`fit_checks`, `sample_weights`, `metrics`, `callbacks`, `module_optimizers`,
`habits`, `task_defaults`) and
`summary`. The step itself is the library's (`tf_interlock.engine`,
`tf_interlock.trainer`): nothing here computes a gradient.
"""
