package incr.serving;

import java.util.ArrayDeque;
import java.util.Collections;
import java.util.Deque;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;

import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.trees.TreeNode;
import org.apache.spark.sql.execution.datasources.FileIndex;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;

import scala.Function1;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.BoxedUnit;

/**
 * The read-only guard of {@code incr serve}: a Spark session extension
 * ({@code spark.sql.extensions}) whose check rule runs on every analysed statement of every
 * session but the server's own, and refuses before it runs anything that is not a read.
 *
 * <p>Refused: every command but those that show or describe (SHOW, DESCRIBE, EXPLAIN, USE,
 * SET, RESET), so no CREATE, DROP, ALTER, INSERT, INSERT OVERWRITE DIRECTORY, LOAD DATA,
 * CACHE, ADD JAR or CREATE FUNCTION; a TRANSFORM (it runs a shell command); reflect and
 * java_method (they call any static Java method); and a read of files outside the folders
 * the server serves (say {@code SELECT * FROM text.`/etc/passwd`}).
 *
 * <p>The server's own session, which registers the answers, is trusted by identity
 * ({@link #trust}); a client cannot become it.
 */
public final class ReadOnlyGuard implements Function1<SparkSessionExtensions, BoxedUnit> {

    private static final Set<SparkSession> TRUSTED =
            Collections.synchronizedSet(Collections.newSetFromMap(new WeakHashMap<>()));
    private static volatile String[] roots = new String[0];

    /** Commands that only show or describe: the rest are refused. */
    private static final Set<String> SHOWING = Set.of(
            "ShowTables", "ShowTablesCommand", "ShowTableExtended", "ShowTablesExtended",
            "ShowNamespaces", "ShowNamespacesCommand", "ShowViews", "ShowViewsCommand",
            "ShowColumns", "ShowColumnsCommand", "ShowFunctions", "ShowFunctionsCommand",
            "ShowCreateTable", "ShowCreateTableCommand", "ShowCreateTableAsSerdeCommand",
            "ShowTableProperties", "ShowTablePropertiesCommand", "ShowPartitions",
            "ShowPartitionsCommand", "ShowCatalogs", "ShowCatalogsCommand",
            "ShowCurrentNamespace", "ShowCurrentNamespaceCommand",
            "DescribeRelation", "DescribeTableCommand", "DescribeColumn", "DescribeColumnCommand",
            "DescribeNamespace", "DescribeDatabaseCommand", "DescribeFunction",
            "DescribeFunctionCommand", "DescribeQueryCommand", "ExplainCommand",
            "SetCommand", "ResetCommand", "SetCatalogAndNamespace", "SetCatalogCommand",
            "SetNamespaceCommand");

    /** Plan and expression nodes that are no read although no command. */
    private static final Map<String, String> FORBIDDEN = Map.of(
            "InsertIntoStatement", "an INSERT",
            "InsertIntoDir", "an INSERT OVERWRITE DIRECTORY",
            "ScriptTransformation", "a TRANSFORM (it runs a program)",
            "CallMethodViaReflection", "reflect/java_method (they call Java methods)",
            "TryReflect", "try_reflect (it calls Java methods)");

    /** Trusts {@code session} (the server's own, which registers the answers). */
    public static void trust(SparkSession session) {
        TRUSTED.add(session);
    }

    /** The folders clients may read files from (absolute paths, separated by newlines). */
    public static void allow(String folders) {
        roots = folders.isEmpty() ? new String[0] : folders.split("\n");
    }

    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        Function1<SparkSession, Function1<LogicalPlan, BoxedUnit>> builder = session -> plan -> {
            if (!TRUSTED.contains(session)) {
                check(plan);
            }
            return BoxedUnit.UNIT;
        };
        extensions.injectCheckRule(builder);
        return BoxedUnit.UNIT;
    }

    private static void check(LogicalPlan statement) {
        Deque<TreeNode<?>> todo = new ArrayDeque<>();
        todo.push(statement);
        while (!todo.isEmpty()) {
            TreeNode<?> node = todo.pop();
            String name = node.getClass().getSimpleName();
            if (node instanceof Command && !SHOWING.contains(name)) {
                refuse(name + " (a command that is not SHOW, DESCRIBE, EXPLAIN, USE or SET)");
            }
            if (FORBIDDEN.containsKey(name)) {
                refuse(FORBIDDEN.get(name));
            }
            if (node instanceof LogicalRelation relation
                    && relation.relation() instanceof HadoopFsRelation files) {
                checkFiles(files.location());
            }
            if (node instanceof SubqueryExpression subquery) {
                todo.push(subquery.plan());
            }
            if (node instanceof LogicalPlan plan) {
                for (Object e : CollectionConverters.asJava(plan.expressions())) {
                    todo.push((TreeNode<?>) e);
                }
            }
            for (Object child : CollectionConverters.asJava(node.children())) {
                todo.push((TreeNode<?>) child);
            }
        }
    }

    private static void checkFiles(FileIndex index) {
        for (Path path : CollectionConverters.asJava(index.rootPaths())) {
            String file = path.toUri().getPath();
            boolean inside = false;
            for (String root : roots) {
                inside |= file.equals(root) || file.startsWith(root.endsWith("/") ? root : root + "/");
            }
            if (!inside) {
                refuse("a read of " + file + ", outside the folders incr serves");
            }
        }
    }

    private static void refuse(String what) {
        throw new SecurityException("incr serve is read-only: " + what + " is refused. Read the "
                + "answers with SELECT (SHOW and DESCRIBE show what there is); incr itself writes "
                + "them");
    }
}
