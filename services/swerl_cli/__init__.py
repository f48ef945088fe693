"""The ``swerl`` command line (a console script): submit and watch jobs through the job API."""
