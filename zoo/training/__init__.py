"""How a zoo model trains where it differs from Keras' own step: `step` (the dispatch's helpers and
the step that takes the loss from the backbone's outputs) and `fused` (the optimizer inside the
backward pass). `ZooModel.train_step` picks one."""
