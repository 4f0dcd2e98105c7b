"""Model families that exist only for the tests, each registered at test time (llmbuild.families.registry)."""
