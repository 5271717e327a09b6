"""The benches: each is run as a module from the project root (`python -m bench.<name> --help`) and prints one JSON
line with its figure and what it was compared against, in the same run. `bench.common` is what several share."""
