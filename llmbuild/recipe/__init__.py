"""Recipes: declarative YAML build descriptions, validated into `llmbuild.recipe_types.Recipe`."""

from llmbuild.recipe.finding import list_recipes
from llmbuild.recipe.loader import load_recipe
from llmbuild.recipe.schema_table import schema_markdown
from llmbuild.recipe_types import Recipe

__all__ = ["Recipe", "list_recipes", "load_recipe", "schema_markdown"]
