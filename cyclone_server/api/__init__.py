"""The unary gRPC services: Workflows, Runs, Schedules and Admin."""
