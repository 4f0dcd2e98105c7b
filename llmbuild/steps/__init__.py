"""The build steps behind each Snakemake rule; each is one `llmbuild <verb>` command."""
