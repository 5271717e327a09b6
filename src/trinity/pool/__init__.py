"""The pool: the models a coordinator routes between, behind one async `ChatModel` interface."""
