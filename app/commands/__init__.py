"""One module per `kvsize` command: each has add_parser(sub) and run(args)."""
