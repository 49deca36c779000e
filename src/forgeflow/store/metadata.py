"""The one SQLAlchemy ``MetaData`` every table of the store is declared on.

It has a module of its own so the task tables (:mod:`forgeflow.store.schema`) and the
pipeline tables (:mod:`forgeflow.store.pipeline_schema`) can both import it without
importing each other.
"""

from __future__ import annotations

from sqlalchemy import MetaData

metadata = MetaData()
