"""Model execution behind one small interface: torch and OpenVINO backends, chosen by name and precision."""
