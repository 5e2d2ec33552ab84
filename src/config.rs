//! The YAML config file (issue 4).
