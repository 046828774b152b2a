"""Device qualification: one command, one report an ops team can file (JSON, JUnit, HTML)."""
